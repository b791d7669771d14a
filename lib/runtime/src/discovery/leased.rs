//! Discovery over a store that holds leases: the one `impl Discovery` that etcd and
//! `file` share. The shared [`LeaseKeeper`] keeps the lease and the leased keys; a
//! backend supplies only its store ([`KvStore`]: reads, unleased writes, removals and a
//! prefix watch, on top of the keeper's [`LeaseStore`]) and a constructor that takes the
//! first lease.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::health::{HealthBoard, Source};
use super::lease::{KeeperConfig, LeaseKeeper, LeaseStore};
use super::{Discovery, DiscoveryHealth, KeyValue, PrefixWatch, WatchEvent};
use crate::config::{DiscoveryBackend, LeaseLossPolicy};
use crate::error::Result;

/// Capacity of a watch's event channel; a full channel pauses the watch's reading.
const WATCH_CHANNEL_CAPACITY: usize = 1024;

/// What a leased discovery backend's store does besides the lease.
#[async_trait]
pub trait KvStore: LeaseStore {
    /// Which backend this is.
    fn backend(&self) -> DiscoveryBackend;

    /// Read one key.
    async fn get(&self, key: &str) -> Result<Option<Bytes>>;

    /// Read every key under `prefix`, in key order.
    async fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>>;

    /// Write `key` with no lease.
    async fn put(&self, key: &str, value: Bytes) -> Result<()>;

    /// Delete `key` (no error if it does not exist).
    async fn remove(&self, key: &str) -> Result<()>;

    /// Snapshot `prefix` and start a task that sends the changes after the snapshot
    /// to `feed` (gap-free, and re-established after the store comes back) until
    /// `feed.alive` is cancelled or the receiver is dropped. Returns the snapshot.
    async fn watch(self: Arc<Self>, prefix: &str, feed: WatchFeed) -> Result<Vec<KeyValue>>;
}

/// Where a store's watch task sends its changes and reports its health.
pub struct WatchFeed {
    pub(crate) tx: mpsc::Sender<WatchEvent>,
    /// Cancelled when the runtime stops (or the backend handle is dropped).
    pub(crate) alive: CancellationToken,
    pub(crate) health: Arc<HealthBoard>,
    /// This watch's entry on the health board.
    pub(crate) source: Source,
}

/// Discovery on a store with one lease per process (etcd, `file`).
pub struct Leased<S: KvStore> {
    store: Arc<S>,
    keeper: LeaseKeeper<S>,
    health: Arc<HealthBoard>,
    /// Child of the root token, cancelled when the handle is dropped: ends watches and
    /// the keeper.
    alive: CancellationToken,
    /// Numbers the watches on the health board.
    next_watch: AtomicU64,
    /// Dropping the handle stops its tasks; the lease then expires after its TTL.
    _stop_on_drop: DropGuard,
}

impl<S: KvStore> Leased<S> {
    /// Start keeping `lease` (just granted by `store`, for `ttl`) alive. `cancel` is the
    /// runtime's root token: the keeper stops with it, and cancels it on a lease loss
    /// under [`LeaseLossPolicy::Shutdown`].
    pub(crate) fn keep(store: Arc<S>, lease: i64, ttl: Duration, policy: LeaseLossPolicy, cancel: CancellationToken) -> Self {
        let alive = cancel.child_token();
        let health = Arc::new(HealthBoard::default());
        let keeper = LeaseKeeper::start(
            store.clone(),
            KeeperConfig { lease, ttl, policy, root: cancel, stop: alive.child_token(), health: health.clone() },
        );
        Leased {
            store,
            keeper,
            health,
            alive: alive.clone(),
            next_watch: AtomicU64::new(0),
            _stop_on_drop: alive.drop_guard(),
        }
    }
}

#[async_trait]
impl<S: KvStore> Discovery for Leased<S> {
    fn backend(&self) -> DiscoveryBackend {
        self.store.backend()
    }

    fn lease_id(&self) -> i64 {
        self.keeper.lease_id()
    }

    fn health(&self) -> DiscoveryHealth {
        self.health.health()
    }

    async fn put_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.keeper.write_leased(key, value, false).await
    }

    async fn create_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.keeper.write_leased(key, value, true).await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        // The key is no longer bound to the lease, so re-registration must not touch it.
        self.keeper.unregister(key, self.store.put(key, value)).await
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        self.store.get(key).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        self.store.scan(prefix).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.keeper.unregister(key, self.store.remove(key)).await
    }

    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch> {
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL_CAPACITY);
        let feed = WatchFeed {
            tx,
            alive: self.alive.clone(),
            health: self.health.clone(),
            source: Source::Watch(self.next_watch.fetch_add(1, Ordering::Relaxed)),
        };
        let initial = self.store.clone().watch(prefix, feed).await?;
        Ok(PrefixWatch { initial, events: rx })
    }

    async fn shutdown(&self) {
        self.keeper.shutdown().await;
    }
}

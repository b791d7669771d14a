//! etcd discovery: one lease per process, kept by the shared
//! [`LeaseKeeper`](super::lease::LeaseKeeper), and prefix watches that resume exactly
//! after the last revision they delivered, for as long as the process lives.
//!
//! While etcd is away, watches deliver nothing (consumers keep routing on what they
//! were told last), the lease keeper retries, and [`Discovery::health`] says
//! `Degraded`. When etcd is back, watches resume (or re-list a compacted prefix) and
//! the keeper keeps or replaces the lease and writes what is missing.

mod store;
mod watch;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Client, ConnectOptions, PutOptions};
use tokio::sync::mpsc;
use tokio::time::timeout;
use tokio_util::sync::{CancellationToken, DropGuard};

use self::store::{ttl_seconds, EtcdStore};
use self::watch::PrefixWatcher;
use super::health::{HealthBoard, Source};
use super::known::KnownKeys;
use super::lease::{KeeperConfig, LeaseKeeper};
use super::{Discovery, DiscoveryHealth, KeyValue, PrefixWatch};
use crate::config::{DiscoveryBackend, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// Capacity of a watch's event channel; a full channel pauses reading the etcd stream.
const WATCH_CHANNEL_CAPACITY: usize = 1024;
/// HTTP/2 pings detect a silently dead connection under long-lived watches. etcd's
/// default `--grpc-keepalive-min-time` is 5 s; pinging faster gets the stream closed.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Discovery on an etcd cluster.
pub struct EtcdDiscovery {
    store: Arc<EtcdStore>,
    keeper: LeaseKeeper<EtcdStore>,
    health: Arc<HealthBoard>,
    /// Child of the root token, cancelled when the handle is dropped: ends watches and
    /// the keeper.
    alive: CancellationToken,
    /// Numbers the watches on the health board.
    next_watch: AtomicU64,
    /// Dropping the handle stops its tasks; the lease then expires after its TTL.
    _stop_on_drop: DropGuard,
}

impl EtcdDiscovery {
    /// Connect to `config.etcd_endpoints`, grant this process's lease and start keeping
    /// it alive. Fails with `Discovery` (naming the endpoints) if etcd does not answer
    /// within `config.connect_timeout`.
    pub async fn connect(config: &RuntimeConfig, cancel: CancellationToken) -> Result<Self> {
        let endpoints = config.etcd_endpoints.join(",");
        let ttl = Duration::from_secs(ttl_seconds(config.lease_ttl).unsigned_abs());
        let options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            .with_keep_alive(HTTP2_PING_INTERVAL, HTTP2_PING_TIMEOUT);
        // The client connects lazily and retries forever, so the whole handshake up to
        // the first answer (the lease grant) is what has to be bounded.
        let handshake = async {
            let mut client = Client::connect(&config.etcd_endpoints, Some(options)).await?;
            let lease = client.lease_grant(ttl_seconds(ttl), None).await?;
            Ok::<_, etcd_client::Error>((client, lease.id()))
        };
        let (client, lease) = match timeout(config.connect_timeout, handshake).await {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => {
                return Err(Error::with_source(
                    ErrorKind::Discovery,
                    format!("cannot use etcd at {endpoints}: {e}"),
                    e,
                ))
            }
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::Discovery,
                    format!(
                        "cannot reach etcd at {endpoints}: no answer within {:?}",
                        config.connect_timeout
                    ),
                ))
            }
        };
        tracing::debug!(lease, endpoints = %endpoints, ?ttl, "etcd lease granted");

        let alive = cancel.child_token();
        let health = Arc::new(HealthBoard::default());
        let store = Arc::new(EtcdStore::new(client, endpoints, ttl));
        let keeper = LeaseKeeper::start(
            store.clone(),
            KeeperConfig {
                lease,
                ttl,
                policy: config.lease_loss,
                root: cancel,
                stop: alive.child_token(),
                health: health.clone(),
            },
        );
        Ok(EtcdDiscovery {
            store,
            keeper,
            health,
            alive: alive.clone(),
            next_watch: AtomicU64::new(0),
            _stop_on_drop: alive.drop_guard(),
        })
    }
}

#[async_trait]
impl Discovery for EtcdDiscovery {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::Etcd
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
        let s = &self.store;
        // The key is no longer bound to the lease, so re-registration must not touch it.
        self.keeper
            .unregister(key, async {
                let mut kv = s.client.kv_client();
                s.request("put", kv.put(key, value.to_vec(), None::<PutOptions>)).await
            })
            .await?;
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let s = &self.store;
        let mut kv = s.client.kv_client();
        let resp = s.request("get", kv.get(key, None)).await?;
        Ok(resp.kvs().first().map(|kv| Bytes::copy_from_slice(kv.value())))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(watch::list(&self.store, prefix).await?.0)
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let s = &self.store;
        self.keeper
            .unregister(key, async {
                let mut kv = s.client.kv_client();
                s.request("delete", kv.delete(key, None)).await
            })
            .await?;
        Ok(())
    }

    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch> {
        let (initial, revision) = watch::list(&self.store, prefix).await?;
        // Starting right after the snapshot's revision is what makes the pair gap-free.
        let stream = watch::open(&self.store, prefix, revision + 1).await?;
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL_CAPACITY);
        let watcher = PrefixWatcher {
            store: self.store.clone(),
            prefix: prefix.to_string(),
            known: KnownKeys::new(&initial),
            next_revision: revision + 1,
            tx,
            alive: self.alive.clone(),
            health: self.health.clone(),
            source: Source::Watch(self.next_watch.fetch_add(1, Ordering::Relaxed)),
        };
        // Owned by `alive` (and by the receiver): it ends when either goes.
        tokio::spawn(watcher.run(stream));
        Ok(PrefixWatch { initial, events: rx })
    }

    async fn shutdown(&self) {
        self.keeper.shutdown().await;
    }
}

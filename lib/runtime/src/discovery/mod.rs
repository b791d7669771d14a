//! The discovery plane: a small key-value store with per-process leases and prefix watches.
//!
//! Instances, event publishers and (later) model cards are registered here. Keys written
//! with [`Discovery::put_leased`] or [`Discovery::create_leased`] live only as long as the
//! process keeps its lease alive; when the process dies they disappear within the lease
//! TTL (etcd) or heartbeat expiry (`file`), and watchers see a delete.

mod backoff;
mod etcd;
mod file;
mod health;
mod known;
mod lease;
mod leased;
mod mem;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::config::{DiscoveryBackend, RuntimeConfig};
use crate::error::Result;

pub use etcd::EtcdDiscovery;
pub use file::FileDiscovery;
pub use health::DiscoveryHealth;
pub use mem::{MemDiscovery, MemStore};

/// One stored key and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The full key.
    pub key: String,
    /// The raw value.
    pub value: Bytes,
}

/// A change seen by a prefix watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    /// A key was created or its value changed.
    Put(KeyValue),
    /// A key was deleted or its owner's lease expired.
    Delete(String),
}

/// The state of a prefix when the watch started, and the changes after it.
///
/// No change between the snapshot and the first event is lost. The receiver ends only
/// when the runtime shuts down (or the backend handle is dropped). When the store goes
/// away the watch re-establishes itself: while it is away no events arrive (consumers
/// keep what they were told last), and when it is back the watch resumes where it left
/// off, or, when that point is no longer available, sends exactly the differences
/// between what it sent before and the store's current state. [`Discovery::health`]
/// says `Degraded` meanwhile.
#[derive(Debug)]
pub struct PrefixWatch {
    /// Keys under the prefix when the watch started.
    pub initial: Vec<KeyValue>,
    /// Changes after the snapshot.
    pub events: mpsc::Receiver<WatchEvent>,
}

/// A discovery backend. All keys are plain strings; callers use `/`-separated paths
/// that end in `/` when used as a watch prefix, so `generate/` never matches
/// `generate_v2/...`.
#[async_trait]
pub trait Discovery: Send + Sync + 'static {
    /// The backend's name, for logs and error messages.
    fn backend(&self) -> DiscoveryBackend;

    /// The id of this process's current lease (changes only after a lease loss).
    fn lease_id(&self) -> i64;

    /// What the backend knows about its connection to its store, now.
    fn health(&self) -> DiscoveryHealth;

    /// Write `key` bound to this process's lease (replacing any value). The key is
    /// written again whenever the lease is replaced. While the lease is lost (see
    /// [`Discovery::health`]) the write is only recorded and `Ok` is returned: it is
    /// done together with the re-registration.
    async fn put_leased(&self, key: &str, value: Bytes) -> Result<()>;

    /// Write `key` bound to this process's lease; fails with `AlreadyExists` if it
    /// exists. While the lease is lost it fails with `Discovery` (whether the key is
    /// free cannot be known then); retry once the backend is healthy again.
    async fn create_leased(&self, key: &str, value: Bytes) -> Result<()>;

    /// Write `key` with no lease: it stays until deleted.
    async fn put(&self, key: &str, value: Bytes) -> Result<()>;

    /// Read one key.
    async fn get(&self, key: &str) -> Result<Option<Bytes>>;

    /// Read every key under `prefix`, in key order.
    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>>;

    /// Delete `key` (no error if it does not exist).
    async fn delete(&self, key: &str) -> Result<()>;

    /// Snapshot `prefix` and stream the changes after the snapshot.
    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch>;

    /// Give up the lease: every leased key of this process disappears now.
    async fn shutdown(&self);
}

/// Connect the backend named by `config`.
///
/// `cancel` is the runtime's root token: the lease keep-alive stops with it, and a
/// backend applying [`crate::config::LeaseLossPolicy::Shutdown`] cancels it.
pub async fn connect(
    config: &RuntimeConfig,
    cancel: CancellationToken,
    mem_store: Option<Arc<MemStore>>,
) -> Result<Arc<dyn Discovery>> {
    Ok(match config.discovery {
        DiscoveryBackend::Mem => Arc::new(MemDiscovery::new(mem_store.unwrap_or_default())),
        DiscoveryBackend::File => Arc::new(FileDiscovery::start(config, cancel).await?),
        DiscoveryBackend::Etcd => Arc::new(EtcdDiscovery::connect(config, cancel).await?),
    })
}

//! etcd discovery: one lease per process, kept by the shared
//! [`LeaseKeeper`](super::lease::LeaseKeeper), and prefix watches that resume exactly
//! after the last revision they delivered, for as long as the process lives.
//!
//! While etcd is away, watches deliver nothing (consumers keep routing on what they
//! were told last), the lease keeper retries, and [`Discovery::health`](super::Discovery::health) says
//! `Degraded`. When etcd is back, watches resume (or re-list a compacted prefix) and
//! the keeper keeps or replaces the lease and writes what is missing.

mod store;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{Client, ConnectOptions, PutOptions};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;

pub use self::store::EtcdStore;
use self::store::ttl_seconds;
use self::watch::PrefixWatcher;
use super::known::KnownKeys;
use super::leased::{KvStore, Leased, WatchFeed};
use super::KeyValue;
use crate::config::{DiscoveryBackend, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// HTTP/2 pings detect a silently dead connection under long-lived watches. etcd's
/// default `--grpc-keepalive-min-time` is 5 s; pinging faster gets the stream closed.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// Discovery on an etcd cluster.
pub type EtcdDiscovery = Leased<EtcdStore>;

impl Leased<EtcdStore> {
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

        let store = Arc::new(EtcdStore::new(client, endpoints, ttl));
        Ok(Leased::keep(store, lease, ttl, config.lease_loss, cancel))
    }
}

#[async_trait]
impl KvStore for EtcdStore {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::Etcd
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let mut kv = self.client.kv_client();
        let resp = self.request("get", kv.get(key, None)).await?;
        Ok(resp.kvs().first().map(|kv| Bytes::copy_from_slice(kv.value())))
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(watch::list(self, prefix).await?.0)
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let mut kv = self.client.kv_client();
        self.request("put", kv.put(key, value.to_vec(), None::<PutOptions>)).await?;
        Ok(())
    }

    async fn remove(&self, key: &str) -> Result<()> {
        let mut kv = self.client.kv_client();
        self.request("delete", kv.delete(key, None)).await?;
        Ok(())
    }

    async fn watch(self: Arc<Self>, prefix: &str, feed: WatchFeed) -> Result<Vec<KeyValue>> {
        let (initial, revision) = watch::list(&self, prefix).await?;
        // Starting right after the snapshot's revision is what makes the pair gap-free.
        let stream = watch::open(&self, prefix, revision + 1).await?;
        let watcher = PrefixWatcher {
            store: self,
            prefix: prefix.to_string(),
            known: KnownKeys::new(&initial),
            next_revision: revision + 1,
            tx: feed.tx,
            alive: feed.alive,
            health: feed.health,
            source: feed.source,
        };
        // Owned by `alive` (and by the receiver): it ends when either goes.
        tokio::spawn(watcher.run(stream));
        Ok(initial)
    }
}

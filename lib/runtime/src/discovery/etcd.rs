//! etcd discovery: one lease per process, kept alive by an owned task, and prefix
//! watches that resume exactly after the revision of their snapshot.
//!
//! When the lease is lost (etcd says it expired, the keep-alive stream breaks, or no
//! keep-alive answer arrives within one TTL) the loss is logged and
//! [`LeaseLossPolicy`] decides: take a new lease and write every leased key again, or
//! cancel the runtime. A process never keeps running with its registrations silently gone.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, SortOrder,
    SortTarget, Txn, TxnOp, WatchOptions,
};
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Discovery, KeyValue, PrefixWatch, WatchEvent};
use crate::config::{DiscoveryBackend, LeaseLossPolicy, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// Bound on one etcd request, so a partitioned etcd fails callers instead of hanging them.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on revoking the lease at shutdown: a dead etcd must not stall process exit
/// (the lease then simply expires after its TTL).
const REVOKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How many times a lost lease is replaced before the runtime is shut down.
const REREGISTER_ATTEMPTS: u32 = 3;
/// Capacity of a watch's event channel; a full channel pauses reading the etcd stream.
const WATCH_CHANNEL_CAPACITY: usize = 1024;
/// HTTP/2 pings detect a silently dead connection under long-lived watches. etcd's
/// default `--grpc-keepalive-min-time` is 5 s; pinging faster gets the stream closed.
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(10);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(5);

/// A key this process wrote under its lease, kept to write it again under a new lease.
struct Registration {
    value: Bytes,
    /// Written with `create_leased`: on re-registration it must not overwrite a key
    /// another process created meanwhile.
    exclusive: bool,
}

/// State shared by the handle and its keep-alive task.
struct Shared {
    client: Client,
    /// The endpoints, joined, for log and error messages.
    endpoints: String,
    ttl: Duration,
    lease: AtomicI64,
    /// Leased keys of this process. Leased writes hold this lock across the etcd call so
    /// a re-registration never interleaves with them (a write could otherwise land on
    /// the dead lease after the re-put, or a deleted key could be re-put).
    registrations: AsyncMutex<HashMap<String, Registration>>,
    policy: LeaseLossPolicy,
    /// The runtime's root token; cancelled when the lease cannot be kept.
    root: CancellationToken,
    /// Child of `root`, cancelled when the handle is dropped: ends watches and keep-alive.
    alive: CancellationToken,
    /// Child of `alive`, cancelled by `shutdown()`: ends only the keep-alive.
    keep_alive_stop: CancellationToken,
}

/// Discovery on an etcd cluster.
pub struct EtcdDiscovery {
    shared: Arc<Shared>,
    keep_alive: parking_lot::Mutex<Option<JoinHandle<()>>>,
    /// Dropping the handle stops its tasks; the lease then expires after its TTL.
    _stop_on_drop: DropGuard,
}

fn ttl_seconds(ttl: Duration) -> i64 {
    // etcd TTLs are whole seconds; round up so the lease never lives shorter than asked.
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

impl Shared {
    /// Run one etcd call under [`REQUEST_TIMEOUT`], turning failures into `Discovery`
    /// errors that name the operation and the endpoints.
    async fn request<T>(
        &self,
        what: &str,
        call: impl Future<Output = std::result::Result<T, etcd_client::Error>>,
    ) -> Result<T> {
        match timeout(REQUEST_TIMEOUT, call).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(Error::with_source(
                ErrorKind::Discovery,
                format!("etcd {what} failed ({}): {e}", self.endpoints),
                e,
            )),
            Err(_) => Err(Error::new(
                ErrorKind::Discovery,
                format!(
                    "etcd {what} got no answer within {REQUEST_TIMEOUT:?} ({})",
                    self.endpoints
                ),
            )),
        }
    }

    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    /// Put `key` under `lease` only if it does not exist (or, when `ours` is given,
    /// still belongs to that lease of ours). Returns whether it was written.
    async fn create(
        &self,
        key: &str,
        value: &Bytes,
        lease: i64,
        ours: Option<i64>,
    ) -> Result<bool> {
        let put = || TxnOp::put(key, value.to_vec(), Some(PutOptions::new().with_lease(lease)));
        if let Some(old) = ours {
            let txn =
                Txn::new().when([Compare::lease(key, CompareOp::Equal, old)]).and_then([put()]);
            let mut kv = self.client.kv_client();
            if self.request("transaction", kv.txn(txn)).await?.succeeded() {
                return Ok(true);
            }
        }
        let txn =
            Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([put()]);
        let mut kv = self.client.kv_client();
        Ok(self.request("transaction", kv.txn(txn)).await?.succeeded())
    }

    /// Keep `lease` alive until the keep-alive is stopped (`None`) or the lease is lost
    /// (`Some(reason)`).
    async fn keep_lease(&self, lease: i64) -> Option<String> {
        let period = self.ttl / 3;
        let mut lease_client = self.client.lease_client();
        let opened = tokio::select! {
            _ = self.keep_alive_stop.cancelled() => return None,
            r = timeout(self.ttl, lease_client.keep_alive(lease)) => r,
        };
        let (mut keeper, mut answers) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(e)) => return Some(format!("opening the keep-alive stream failed: {e}")),
            Err(_) => return Some(format!("no keep-alive answer within the TTL ({:?})", self.ttl)),
        };
        // Opening the stream already renewed the lease once.
        let mut last_renewed = Instant::now();
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.keep_alive_stop.cancelled() => return None,
                _ = tick.tick() => {
                    if let Err(e) = keeper.keep_alive().await {
                        return Some(format!("sending a keep-alive failed: {e}"));
                    }
                }
                answer = answers.message() => match answer {
                    Ok(Some(resp)) if resp.ttl() > 0 => last_renewed = Instant::now(),
                    Ok(Some(_)) => return Some("etcd answered TTL 0: the lease has expired".into()),
                    Ok(None) => return Some("etcd closed the keep-alive stream".into()),
                    Err(e) => return Some(format!("the keep-alive stream failed: {e}")),
                },
                _ = tokio::time::sleep_until(last_renewed + self.ttl) => {
                    return Some(format!("no keep-alive answer for a whole TTL ({:?})", self.ttl));
                }
            }
        }
    }

    /// Grant a new lease and write every registration again under it. Keys created
    /// with `create_leased` that another process took meanwhile are given up (logged).
    async fn reregister(&self) -> Result<i64> {
        let mut registrations = self.registrations.lock().await;
        let old = self.lease_id();
        let period = self.ttl / 3;
        let attempt_timeout = period.max(Duration::from_secs(1));
        let mut last_error = None;
        for attempt in 1..=REREGISTER_ATTEMPTS {
            if attempt > 1 {
                tokio::select! {
                    _ = self.keep_alive_stop.cancelled() => break,
                    _ = sleep(period) => {}
                }
            }
            let once = async {
                let mut lease_client = self.client.lease_client();
                let lease = lease_client.grant(ttl_seconds(self.ttl), None).await.map_err(|e| {
                    Error::with_source(ErrorKind::Discovery, format!("lease grant failed: {e}"), e)
                })?;
                let lease = lease.id();
                self.lease.store(lease, Ordering::Release);
                let mut taken = Vec::new();
                for (key, reg) in registrations.iter() {
                    if reg.exclusive {
                        if !self.create(key, &reg.value, lease, Some(old)).await? {
                            taken.push(key.clone());
                        }
                    } else {
                        let mut kv = self.client.kv_client();
                        let options = PutOptions::new().with_lease(lease);
                        self.request(
                            "put",
                            kv.put(key.as_str(), reg.value.to_vec(), Some(options)),
                        )
                        .await?;
                    }
                }
                Ok::<_, Error>((lease, taken))
            };
            let outcome = tokio::select! {
                _ = self.keep_alive_stop.cancelled() => break,
                r = timeout(attempt_timeout, once) => r,
            };
            match outcome {
                Ok(Ok((lease, taken))) => {
                    for key in taken {
                        tracing::warn!(
                            key = %key,
                            "another process created this key while our etcd lease was lost; \
                             giving it up"
                        );
                        registrations.remove(&key);
                    }
                    return Ok(lease);
                }
                Ok(Err(e)) => {
                    tracing::warn!(attempt, error = %e.full_message(), "etcd re-registration attempt failed");
                    last_error = Some(e);
                }
                Err(_) => {
                    tracing::warn!(
                        attempt,
                        "etcd re-registration attempt timed out after {attempt_timeout:?}"
                    );
                    last_error = Some(Error::new(
                        ErrorKind::Discovery,
                        format!("re-registration timed out after {attempt_timeout:?}"),
                    ));
                }
            }
        }
        Err(last_error.unwrap_or_else(|| Error::new(ErrorKind::Shutdown, "keep-alive stopped")))
    }

    /// The keep-alive task: renew the lease; on loss apply the policy.
    async fn keep_alive_loop(self: Arc<Self>) {
        loop {
            let lease = self.lease_id();
            let Some(reason) = self.keep_lease(lease).await else { return };
            if self.keep_alive_stop.is_cancelled() {
                return;
            }
            tracing::error!(lease, endpoints = %self.endpoints, reason = %reason, "etcd lease lost");
            match self.policy {
                LeaseLossPolicy::Shutdown => {
                    tracing::error!("DYN_LEASE_LOSS=shutdown: shutting the runtime down");
                    self.root.cancel();
                    return;
                }
                LeaseLossPolicy::Reregister => match self.reregister().await {
                    Ok(new) => {
                        tracing::warn!(old = lease, new, "re-registered under a new etcd lease");
                    }
                    Err(_) if self.keep_alive_stop.is_cancelled() => return,
                    Err(e) => {
                        tracing::error!(
                            endpoints = %self.endpoints,
                            error = %e.full_message(),
                            "could not re-register after losing the etcd lease; shutting the runtime down"
                        );
                        self.root.cancel();
                        return;
                    }
                },
            }
        }
    }
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
        let shared = Arc::new(Shared {
            client,
            endpoints,
            ttl,
            lease: AtomicI64::new(lease),
            registrations: AsyncMutex::new(HashMap::new()),
            policy: config.lease_loss,
            root: cancel,
            keep_alive_stop: alive.child_token(),
            alive: alive.clone(),
        });
        let keep_alive = tokio::spawn(shared.clone().keep_alive_loop());
        Ok(EtcdDiscovery {
            shared,
            keep_alive: parking_lot::Mutex::new(Some(keep_alive)),
            _stop_on_drop: alive.drop_guard(),
        })
    }
}

fn to_key_value(kv: &etcd_client::KeyValue) -> Option<KeyValue> {
    match kv.key_str() {
        Ok(key) => {
            Some(KeyValue { key: key.to_string(), value: Bytes::copy_from_slice(kv.value()) })
        }
        Err(_) => {
            // Every key this runtime writes is a string; anything else is foreign.
            tracing::warn!(key = ?kv.key(), "skipping a non-UTF-8 etcd key");
            None
        }
    }
}

#[async_trait]
impl Discovery for EtcdDiscovery {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::Etcd
    }

    fn lease_id(&self) -> i64 {
        self.shared.lease_id()
    }

    async fn put_leased(&self, key: &str, value: Bytes) -> Result<()> {
        let s = &self.shared;
        let mut registrations = s.registrations.lock().await;
        let options = PutOptions::new().with_lease(s.lease_id());
        let mut kv = s.client.kv_client();
        s.request("put", kv.put(key, value.to_vec(), Some(options))).await?;
        registrations.insert(key.to_string(), Registration { value, exclusive: false });
        Ok(())
    }

    async fn create_leased(&self, key: &str, value: Bytes) -> Result<()> {
        let s = &self.shared;
        let mut registrations = s.registrations.lock().await;
        if !s.create(key, &value, s.lease_id(), None).await? {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("key {key} already exists")));
        }
        registrations.insert(key.to_string(), Registration { value, exclusive: true });
        Ok(())
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let s = &self.shared;
        // The key is no longer bound to the lease, so re-registration must not touch it.
        let mut registrations = s.registrations.lock().await;
        let mut kv = s.client.kv_client();
        s.request("put", kv.put(key, value.to_vec(), None)).await?;
        registrations.remove(key);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let s = &self.shared;
        let mut kv = s.client.kv_client();
        let resp = s.request("get", kv.get(key, None)).await?;
        Ok(resp.kvs().first().map(|kv| Bytes::copy_from_slice(kv.value())))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let s = &self.shared;
        let mut kv = s.client.kv_client();
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend);
        let resp = s.request("get", kv.get(prefix, Some(options))).await?;
        Ok(resp.kvs().iter().filter_map(to_key_value).collect())
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let s = &self.shared;
        let mut registrations = s.registrations.lock().await;
        let mut kv = s.client.kv_client();
        s.request("delete", kv.delete(key, None)).await?;
        registrations.remove(key);
        Ok(())
    }

    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch> {
        let s = &self.shared;
        let mut kv = s.client.kv_client();
        let options = GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend);
        let snapshot = s.request("get", kv.get(prefix, Some(options))).await?;
        let revision = snapshot.header().map(|h| h.revision()).ok_or_else(|| {
            Error::new(
                ErrorKind::Discovery,
                format!("etcd get answered without a revision ({})", s.endpoints),
            )
        })?;
        let initial = snapshot.kvs().iter().filter_map(to_key_value).collect();

        // Starting right after the snapshot's revision is what makes the pair gap-free.
        let options = WatchOptions::new().with_prefix().with_start_revision(revision + 1);
        let mut watch_client = s.client.watch_client();
        let mut stream = s.request("watch", watch_client.watch(prefix, Some(options))).await?;

        let (tx, rx) = mpsc::channel(WATCH_CHANNEL_CAPACITY);
        let alive = s.alive.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    _ = alive.cancelled() => return,
                    _ = tx.closed() => return,
                    m = stream.message() => m,
                };
                let resp = match message {
                    Ok(Some(resp)) => resp,
                    Ok(None) => {
                        tracing::error!(prefix = %prefix, "etcd closed the watch stream; ending the watch");
                        return;
                    }
                    Err(e) => {
                        tracing::error!(prefix = %prefix, error = %e, "etcd watch failed; ending the watch");
                        return;
                    }
                };
                if resp.canceled() {
                    tracing::error!(
                        prefix = %prefix,
                        reason = resp.cancel_reason(),
                        compact_revision = resp.compact_revision(),
                        "etcd cancelled the watch; ending it"
                    );
                    return;
                }
                for event in resp.events() {
                    let Some(kv) = event.kv().and_then(to_key_value) else { continue };
                    let event = match event.event_type() {
                        EventType::Put => WatchEvent::Put(kv),
                        EventType::Delete => WatchEvent::Delete(kv.key),
                    };
                    tokio::select! {
                        _ = alive.cancelled() => return,
                        sent = tx.send(event) => if sent.is_err() { return },
                    }
                }
            }
        });
        Ok(PrefixWatch { initial, events: rx })
    }

    async fn shutdown(&self) {
        let s = &self.shared;
        s.keep_alive_stop.cancel();
        let keep_alive = self.keep_alive.lock().take();
        if let Some(task) = keep_alive {
            if timeout(REVOKE_TIMEOUT, task).await.is_err() {
                tracing::warn!("etcd keep-alive task did not stop within {REVOKE_TIMEOUT:?}");
            }
        }
        let mut registrations = s.registrations.lock().await;
        registrations.clear();
        let lease = s.lease_id();
        let mut lease_client = s.client.lease_client();
        match timeout(REVOKE_TIMEOUT, lease_client.revoke(lease)).await {
            Ok(Ok(_)) => tracing::debug!(lease, "etcd lease revoked"),
            Ok(Err(e)) => {
                tracing::warn!(lease, error = %e, "revoking the etcd lease failed; it expires after its TTL")
            }
            Err(_) => tracing::warn!(
                lease,
                "revoking the etcd lease got no answer within {REVOKE_TIMEOUT:?}; it expires after its TTL"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(2)), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(2500)), 3);
        assert_eq!(ttl_seconds(Duration::ZERO), 1);
    }
}

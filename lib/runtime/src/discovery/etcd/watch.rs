//! An etcd prefix watch that lasts as long as the process: when the stream breaks it is
//! opened again (with backoff) from the revision after the last one delivered; when
//! that revision has been compacted away (or etcd came back with less history than the
//! watch delivered), the prefix is read again and the consumer gets exactly the
//! differences from what it was told before.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    EventType, GetOptions, SortOrder, SortTarget, WatchOptions, WatchResponse, WatchStream,
};
use tokio::sync::mpsc;
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use super::store::EtcdStore;
use crate::discovery::backoff::Backoff;
use crate::discovery::health::{HealthBoard, Source};
use crate::discovery::known::KnownKeys;
use crate::discovery::{KeyValue, WatchEvent};
use crate::error::{Error, ErrorKind, Result};

/// First and longest delay between attempts to re-open a broken watch.
const RETRY_INITIAL: Duration = Duration::from_millis(100);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// Why following a watch stream stopped.
enum Ended {
    /// The runtime stopped or the consumer dropped the receiver.
    Stopped,
    /// The next revision to deliver was compacted (or the store lost its history):
    /// re-list the prefix.
    Compacted,
    /// The stream broke: re-open it.
    Broken(String),
}

/// One prefix watch and everything needed to resume it.
pub(super) struct PrefixWatcher {
    pub(super) store: Arc<EtcdStore>,
    pub(super) prefix: String,
    pub(super) known: KnownKeys,
    /// The first revision not yet delivered.
    pub(super) next_revision: i64,
    pub(super) tx: mpsc::Sender<WatchEvent>,
    /// Cancelled when the runtime stops (or the backend handle is dropped).
    pub(super) alive: CancellationToken,
    pub(super) health: Arc<HealthBoard>,
    /// This watch's entry on the health board.
    pub(super) source: Source,
}

pub(super) fn to_key_value(kv: &etcd_client::KeyValue) -> Option<KeyValue> {
    match kv.key_str() {
        Ok(key) => Some(KeyValue {
            key: key.to_string(),
            value: bytes::Bytes::copy_from_slice(kv.value()),
        }),
        Err(_) => {
            // Every key this runtime writes is a string; anything else is foreign.
            tracing::warn!(key = ?kv.key(), "skipping a non-UTF-8 etcd key");
            None
        }
    }
}

/// Read every key under `prefix` and the store revision of that read.
pub(super) async fn list(store: &EtcdStore, prefix: &str) -> Result<(Vec<KeyValue>, i64)> {
    let mut kv = store.client.kv_client();
    let options = GetOptions::new().with_prefix().with_sort(SortTarget::Key, SortOrder::Ascend);
    let snapshot = store.request("get", kv.get(prefix, Some(options))).await?;
    let revision = snapshot.header().map(|h| h.revision()).ok_or_else(|| {
        Error::new(
            ErrorKind::Discovery,
            format!("etcd get answered without a revision ({})", store.endpoints),
        )
    })?;
    Ok((snapshot.kvs().iter().filter_map(to_key_value).collect(), revision))
}

/// Open a watch of `prefix` delivering every change from `revision` on.
pub(super) async fn open(store: &EtcdStore, prefix: &str, revision: i64) -> Result<WatchStream> {
    // Progress notifications move the resume point forward on a quiet prefix, so a
    // reconnect rarely lands on a compacted revision.
    let options =
        WatchOptions::new().with_prefix().with_start_revision(revision).with_progress_notify();
    let mut watch_client = store.client.watch_client();
    store.request("watch", watch_client.watch(prefix, Some(options))).await
}

fn is_compaction(message: &str) -> bool {
    message.contains("compacted")
}

impl PrefixWatcher {
    /// Follow `stream` (opened from `next_revision`), re-opening it whenever it breaks,
    /// until the runtime stops or the consumer drops the receiver.
    pub(super) async fn run(mut self, stream: WatchStream) {
        let mut retry = Backoff::new(RETRY_INITIAL, RETRY_MAX);
        let mut stream = Some(stream);
        let mut relist = false;
        loop {
            if relist {
                match self.relist().await {
                    Ok(true) => relist = false,
                    Ok(false) => break,
                    Err(e) => {
                        self.interrupted(&e.to_string());
                        if !self.pause(retry.next_delay()).await {
                            break;
                        }
                        continue;
                    }
                }
            }
            let current = match stream.take() {
                Some(stream) => stream,
                None => match open(&self.store, &self.prefix, self.next_revision).await {
                    Ok(stream) => stream,
                    Err(e) if is_compaction(&e.to_string()) => {
                        relist = true;
                        continue;
                    }
                    Err(e) => {
                        self.interrupted(&e.to_string());
                        if !self.pause(retry.next_delay()).await {
                            break;
                        }
                        continue;
                    }
                },
            };
            match self.follow(current, &mut retry).await {
                Ended::Stopped => break,
                Ended::Compacted => relist = true,
                Ended::Broken(reason) => {
                    self.interrupted(&reason);
                    if !self.pause(retry.next_delay()).await {
                        break;
                    }
                }
            }
        }
        // A watch nobody reads any more is no reason to call the backend degraded.
        self.health.clear(self.source);
    }

    /// Whether the watch should go on (neither the runtime nor the consumer stopped).
    fn stopped(&self) -> bool {
        self.alive.is_cancelled() || self.tx.is_closed()
    }

    /// Wait `delay`; `false` if the watch should end instead.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            _ = self.alive.cancelled() => false,
            _ = self.tx.closed() => false,
            _ = sleep(delay) => true,
        }
    }

    /// Record that the watch is interrupted (logged once per interruption).
    fn interrupted(&self, reason: &str) {
        let problem = format!("etcd watch on {} interrupted: {reason}", self.prefix);
        if self.health.report(self.source, problem) {
            tracing::warn!(
                prefix = %self.prefix,
                endpoints = %self.store.endpoints,
                reason = %reason,
                "etcd watch interrupted; re-establishing it (routing continues on what was last known)"
            );
        } else {
            tracing::debug!(prefix = %self.prefix, reason = %reason, "etcd watch still interrupted");
        }
    }

    /// Send `event` to the consumer, remembering it; `false` if the watch should end.
    async fn send(&mut self, event: WatchEvent) -> bool {
        self.known.apply(&event);
        tokio::select! {
            _ = self.alive.cancelled() => false,
            sent = self.tx.send(event) => sent.is_ok(),
        }
    }

    /// Read the prefix again and send the differences from what the consumer knows.
    /// `Ok(false)` if the watch should end.
    async fn relist(&mut self) -> Result<bool> {
        let (current, revision) = tokio::select! {
            _ = self.alive.cancelled() => return Ok(false),
            listed = list(&self.store, &self.prefix) => listed?,
        };
        let events = self.known.resync(current);
        tracing::info!(
            prefix = %self.prefix,
            changes = events.len(),
            revision,
            "etcd watch resumed past a compacted revision by reading the prefix again"
        );
        for event in events {
            // Already applied to `known` by resync; send without applying twice.
            let sent = tokio::select! {
                _ = self.alive.cancelled() => false,
                sent = self.tx.send(event) => sent.is_ok(),
            };
            if !sent {
                return Ok(false);
            }
        }
        self.next_revision = revision + 1;
        Ok(true)
    }

    /// Deliver the events of `stream` until it ends.
    async fn follow(&mut self, mut stream: WatchStream, retry: &mut Backoff) -> Ended {
        loop {
            let message = tokio::select! {
                _ = self.alive.cancelled() => return Ended::Stopped,
                _ = self.tx.closed() => return Ended::Stopped,
                m = stream.message() => m,
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Ended::Broken("etcd closed the watch stream".into()),
                Err(e) if is_compaction(&e.to_string()) => return Ended::Compacted,
                Err(e) => return Ended::Broken(format!("the watch stream failed: {e}")),
            };
            if response.canceled() {
                if response.compact_revision() > 0 || is_compaction(response.cancel_reason()) {
                    return Ended::Compacted;
                }
                return Ended::Broken(format!(
                    "etcd cancelled the watch: {}",
                    response.cancel_reason()
                ));
            }
            if response.created() {
                let current = response.header().map_or(i64::MAX, |h| h.revision());
                if current + 1 < self.next_revision {
                    // The store is behind what we delivered: etcd lost its data (started
                    // afresh or restored from a backup). Resuming would wait for
                    // revisions that mean something else now; read the prefix instead.
                    tracing::warn!(
                        prefix = %self.prefix,
                        revision = current,
                        delivered = self.next_revision - 1,
                        "etcd is at an older revision than this watch delivered; reading the prefix again"
                    );
                    return Ended::Compacted;
                }
                retry.reset();
                if let Some(since) = self.health.clear(self.source) {
                    tracing::info!(
                        prefix = %self.prefix,
                        revision = self.next_revision,
                        "etcd watch re-established after {:?}",
                        since.elapsed()
                    );
                }
            }
            if !self.deliver(&response).await {
                return Ended::Stopped;
            }
            if self.stopped() {
                return Ended::Stopped;
            }
        }
    }

    /// Send the events of one response; `false` if the watch should end.
    async fn deliver(&mut self, response: &WatchResponse) -> bool {
        if response.events().is_empty() && !response.created() {
            // A progress notification: every change up to this revision was delivered.
            if let Some(header) = response.header() {
                self.next_revision = self.next_revision.max(header.revision() + 1);
            }
            return true;
        }
        for event in response.events() {
            let Some(raw) = event.kv() else { continue };
            self.next_revision = self.next_revision.max(raw.mod_revision() + 1);
            let Some(kv) = to_key_value(raw) else { continue };
            let event = match event.event_type() {
                EventType::Put => WatchEvent::Put(kv),
                EventType::Delete => WatchEvent::Delete(kv.key),
            };
            if !self.send(event).await {
                return false;
            }
        }
        true
    }
}

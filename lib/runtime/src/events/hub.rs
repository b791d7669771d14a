//! Subscription tables of the embedded (TCP) event plane. The hub registers itself with
//! the transport as the handler of the event frames (Subscribe, Event, SubscribeSync,
//! Subscribed).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, Notify};

use super::{subject_matches, Event};
use futures::future::BoxFuture;

use crate::transport::connection::TrySendError;
use crate::transport::dispatch::FrameHandler;
use crate::transport::frame::{Frame, FrameKind};
use crate::transport::link::Link;

struct RemoteSubscriber {
    conn: Weak<Link>,
    conn_id: u64,
    sub_id: u64,
    pattern: String,
}

/// Who wants which events: remote subscribers of this process's publications, and this
/// process's own subscriptions.
#[derive(Default)]
pub(crate) struct EventHub {
    remote: Mutex<Vec<RemoteSubscriber>>,
    local: Mutex<HashMap<u64, (String, mpsc::Sender<Event>)>>,
    next_sub: AtomicU64,
    dropped: AtomicU64,
    /// Publisher side: instances that sent a SubscribeSync (their subscriptions are here).
    synced: Mutex<HashSet<u64>>,
    synced_changed: Notify,
    /// Subscriber side: SubscribeSync tokens awaiting their Subscribed answer.
    awaiting: Mutex<HashMap<u64, oneshot::Sender<()>>>,
}

impl EventHub {
    /// The frame kinds the hub handles.
    pub(crate) const FRAMES: [FrameKind; 4] =
        [FrameKind::Subscribe, FrameKind::Event, FrameKind::SubscribeSync, FrameKind::Subscribed];

    /// A peer subscribed on `conn` (Subscribe frame).
    pub(crate) fn add_remote_subscriber(&self, conn: &Arc<Link>, sub_id: u64, header: &[u8]) {
        let pattern = match serde_json::from_slice::<serde_json::Value>(header) {
            Ok(v) => v.get("subject").and_then(|s| s.as_str()).unwrap_or_default().to_string(),
            Err(e) => {
                tracing::warn!(peer = %conn.peer(), error = %e, "malformed Subscribe frame");
                return;
            }
        };
        let mut remote = self.remote.lock();
        if !remote.iter().any(|r| r.conn_id == conn.id() && r.sub_id == sub_id) {
            remote.push(RemoteSubscriber { conn: Arc::downgrade(conn), conn_id: conn.id(), sub_id, pattern });
        }
    }

    /// A peer sent SubscribeSync on `conn`: every Subscribe it sent before is recorded.
    /// Remember the peer as synced and answer Subscribed.
    pub(crate) async fn subscribe_sync(&self, conn: &Arc<Link>, token: u64) {
        if let Some(instance) = conn.peer_instance() {
            self.synced.lock().insert(instance);
            self.synced_changed.notify_waiters();
        }
        if let Err(e) = conn.send(Frame::control(FrameKind::Subscribed, token)).await {
            tracing::debug!(peer = %conn.peer(), error = %e, "cannot answer SubscribeSync");
        }
    }

    /// Wait until each of `instances` has sent a SubscribeSync, or `bound` passed; returns
    /// the instances still missing.
    pub(crate) async fn wait_synced(&self, instances: &[u64], bound: Duration) -> Vec<u64> {
        let missing = || -> Vec<u64> {
            let synced = self.synced.lock();
            instances.iter().copied().filter(|i| !synced.contains(i)).collect()
        };
        let _ = tokio::time::timeout(bound, async {
            loop {
                let changed = self.synced_changed.notified();
                if missing().is_empty() {
                    return;
                }
                changed.await;
            }
        })
        .await;
        missing()
    }

    /// A SubscribeSync frame with a fresh token, and the receiver its Subscribed answer fires.
    pub(crate) fn sync_request(&self) -> (Frame, oneshot::Receiver<()>) {
        let token = self.next_sub.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        self.awaiting.lock().insert(token, tx);
        (Frame::control(FrameKind::SubscribeSync, token), rx)
    }

    /// A Subscribed frame arrived: the publisher holds the subscriptions sent before `token`.
    pub(crate) fn subscribed(&self, token: u64) {
        if let Some(tx) = self.awaiting.lock().remove(&token) {
            let _ = tx.send(());
        }
    }

    /// Forget a SubscribeSync whose answer is no longer awaited.
    pub(crate) fn forget_sync(&self, token: u64) {
        self.awaiting.lock().remove(&token);
    }

    pub(crate) fn connection_closed(&self, conn_id: u64) {
        self.remote.lock().retain(|r| r.conn_id != conn_id);
    }

    /// Send an event to every remote subscriber whose pattern matches.
    pub(crate) fn publish(&self, subject: &str, payload: &Bytes) {
        let targets: Vec<(Arc<Link>, u64)> = self
            .remote
            .lock()
            .iter()
            .filter(|r| subject_matches(&r.pattern, subject))
            .filter_map(|r| r.conn.upgrade().map(|c| (c, r.sub_id)))
            .collect();
        let subject = Bytes::copy_from_slice(subject.as_bytes());
        for (conn, sub_id) in targets {
            let frame = Frame::with_header(FrameKind::Event, sub_id, subject.clone(), payload.clone());
            if let Err(TrySendError::Full(_)) = conn.try_send(frame) {
                self.note_drop(conn.peer());
            }
        }
    }

    /// Register a local subscription; returns its id and receiver.
    pub(crate) fn add_local(&self, pattern: &str) -> (u64, mpsc::Receiver<Event>) {
        let id = self.next_sub.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = mpsc::channel(super::SUBSCRIPTION_BUFFER);
        self.local.lock().insert(id, (pattern.to_string(), tx));
        (id, rx)
    }

    pub(crate) fn remove_local(&self, id: u64) {
        self.local.lock().remove(&id);
    }

    /// Local subscriptions as (id, pattern), to replay on a new publisher connection.
    pub(crate) fn local_subscriptions(&self) -> Vec<(u64, String)> {
        self.local.lock().iter().map(|(id, (p, _))| (*id, p.clone())).collect()
    }

    /// An Event frame arrived for local subscription `sub_id`.
    pub(crate) fn deliver(&self, sub_id: u64, subject: Bytes, payload: Bytes) {
        let tx = self.local.lock().get(&sub_id).map(|(_, tx)| tx.clone());
        if let Some(tx) = tx {
            let event = Event { subject: String::from_utf8_lossy(&subject).into_owned(), payload };
            if tx.try_send(event).is_err() && !tx.is_closed() {
                self.note_drop("local subscriber");
            }
        }
    }

    fn note_drop(&self, who: &str) {
        let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(subscriber = who, dropped_total = n, "event subscriber is too slow; dropping events");
        }
    }
}

impl FrameHandler for EventHub {
    fn on_frame<'a>(&'a self, conn: &'a Arc<Link>, frame: Frame) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            match frame.kind {
                FrameKind::Subscribe => self.add_remote_subscriber(conn, frame.stream, &frame.header),
                FrameKind::Event => self.deliver(frame.stream, frame.header, frame.body),
                FrameKind::SubscribeSync => self.subscribe_sync(conn, frame.stream).await,
                FrameKind::Subscribed => self.subscribed(frame.stream),
                other => tracing::debug!(kind = ?other, "not an event frame; ignored"),
            }
        })
    }

    fn connection_closed(&self, conn_id: u64) {
        EventHub::connection_closed(self, conn_id);
    }
}

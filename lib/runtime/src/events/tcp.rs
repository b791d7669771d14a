//! The embedded backend of the event plane. A process that publishes registers its
//! address under `v1/event_publishers/`; subscribers watch that prefix, connect to every
//! publisher and send their subscriptions; publishers forward matching events.
//!
//! No event published after a subscription is acknowledged is lost to a connected
//! subscriber (docs/architecture.md, "The event plane"): a subscriber registers under
//! `v1/event_subscribers/` before it reads the publishers, and `subscribe` returns once
//! every known publisher answered its SubscribeSync; a new publisher registers before it
//! reads the subscribers, and holds its first publication until each of them has
//! connected and synced. Both waits are bounded by [`SYNC_TIMEOUT`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::{EventHub, Subscription};
use crate::discovery::{Discovery, WatchEvent};
use crate::error::Result;
use crate::transport::frame::{Frame, FrameKind};
use crate::transport::link::Link;
use crate::transport::Transport;

const PUBLISHERS_PREFIX: &str = "v1/event_publishers/";
const SUBSCRIBERS_PREFIX: &str = "v1/event_subscribers/";

/// Bound on a subscription waiting for a publisher's acknowledgement, and on a new
/// publisher waiting for the subscribers known from discovery to connect.
const SYNC_TIMEOUT: Duration = Duration::from_secs(3);

/// The embedded event plane of one process.
pub struct TcpEventPlane {
    transport: Arc<Transport>,
    discovery: Arc<dyn Discovery>,
    hub: Arc<EventHub>,
    registered: OnceCell<()>,
    subscriber_registered: OnceCell<()>,
    watching: OnceCell<()>,
    publishers: Arc<Mutex<HashMap<String, Arc<Link>>>>,
}

impl TcpEventPlane {
    pub(super) fn new(transport: Arc<Transport>, discovery: Arc<dyn Discovery>) -> Self {
        let hub = Arc::new(EventHub::default());
        transport.register_frames(&EventHub::FRAMES, hub.clone());
        TcpEventPlane {
            transport,
            discovery,
            hub,
            registered: OnceCell::new(),
            subscriber_registered: OnceCell::new(),
            watching: OnceCell::new(),
            publishers: Default::default(),
        }
    }

    pub(super) async fn publish(&self, subject: &str, payload: Bytes) -> Result<()> {
        self.registered.get_or_try_init(|| self.register_publisher()).await?;
        self.hub.publish(subject, &payload);
        Ok(())
    }

    /// Register as a publisher, then wait (bounded) for the subscribers registered so far
    /// to connect and sync, so that the first publication reaches them.
    async fn register_publisher(&self) -> Result<()> {
        self.register(PUBLISHERS_PREFIX).await?;
        let subscribers: Vec<u64> = self
            .discovery
            .get_prefix(SUBSCRIBERS_PREFIX)
            .await?
            .iter()
            .filter_map(|kv| u64::from_str_radix(kv.key.strip_prefix(SUBSCRIBERS_PREFIX)?, 16).ok())
            .collect();
        let missing = self.hub.wait_synced(&subscribers, SYNC_TIMEOUT).await;
        if !missing.is_empty() {
            let missing: Vec<String> = missing.iter().map(|i| format!("{i:x}")).collect();
            tracing::warn!(?missing, "event subscribers did not connect within {SYNC_TIMEOUT:?}; they may miss the first events");
        }
        Ok(())
    }

    async fn register(&self, prefix: &str) -> Result<()> {
        let key = format!("{prefix}{:x}", self.transport.instance_id);
        let value = serde_json::to_vec(&serde_json::json!({"address": self.transport.address()}))?;
        self.discovery.put_leased(&key, value.into()).await
    }

    /// Subscribe; returns once every publisher known from discovery acknowledged (each
    /// bounded by [`SYNC_TIMEOUT`]).
    pub(super) async fn subscribe(&self, subject: &str) -> Result<Subscription> {
        let (id, rx) = self.hub.add_local(subject);
        let guard = Unsubscribe { hub: self.hub.clone(), id };
        // Registered before the publishers are read: a publisher that this read misses
        // finds this subscriber in discovery and waits for it.
        self.subscriber_registered.get_or_try_init(|| self.register(SUBSCRIBERS_PREFIX)).await?;
        self.watching.get_or_try_init(|| self.watch_publishers()).await?;
        let conns: Vec<Arc<Link>> = self.publishers.lock().values().cloned().collect();
        futures::future::join_all(conns.iter().map(|conn| async {
            if conn.send(subscribe_frame(id, subject)).await.is_ok() {
                sync(&self.hub, conn).await;
            }
        }))
        .await;
        Ok(Subscription::new(rx, guard))
    }

    async fn watch_publishers(&self) -> Result<()> {
        let mut watch = self.discovery.watch_prefix(PUBLISHERS_PREFIX).await?;
        for kv in std::mem::take(&mut watch.initial) {
            connect_publisher(&self.transport, &self.hub, &self.publishers, &kv.key, &kv.value).await;
        }
        let transport = self.transport.clone();
        let hub = self.hub.clone();
        let publishers = self.publishers.clone();
        let cancel = transport.cancel.clone();
        self.transport.tracker.spawn(async move {
            loop {
                let event = tokio::select! {
                    e = watch.events.recv() => e,
                    _ = cancel.cancelled() => return,
                };
                match event {
                    Some(WatchEvent::Put(kv)) => connect_publisher(&transport, &hub, &publishers, &kv.key, &kv.value).await,
                    Some(WatchEvent::Delete(key)) => {
                        publishers.lock().remove(&key);
                    }
                    None => {
                        if !transport.is_shutting_down() {
                            tracing::error!("event publisher watch ended; no new publishers will be found");
                        }
                        return;
                    }
                }
            }
        });
        Ok(())
    }
}

async fn connect_publisher(
    transport: &Arc<Transport>,
    hub: &EventHub,
    publishers: &Mutex<HashMap<String, Arc<Link>>>,
    key: &str,
    value: &[u8],
) {
    let Some(address) = serde_json::from_slice::<serde_json::Value>(value)
        .ok()
        .and_then(|v| v.get("address").and_then(|a| a.as_str()).map(str::to_string))
    else {
        tracing::warn!(key, "malformed event publisher registration");
        return;
    };
    match transport.connection(&address).await {
        Ok(conn) => {
            // Listed before the subscriptions are read, so that a concurrent `subscribe`
            // either is among them or sends its own to this connection.
            publishers.lock().insert(key.to_string(), conn.clone());
            for (id, pattern) in hub.local_subscriptions() {
                let _ = conn.send(subscribe_frame(id, &pattern)).await;
            }
            sync(hub, &conn).await;
        }
        Err(e) => tracing::warn!(address, error = %e, "cannot reach event publisher"),
    }
}

/// Send SubscribeSync on `conn` and wait (bounded) for the publisher's answer: it then
/// holds every subscription sent before on this connection.
async fn sync(hub: &EventHub, conn: &Link) {
    let (frame, answered) = hub.sync_request();
    let token = frame.stream;
    let sent = conn.send(frame).await.is_ok();
    let acknowledged = sent && matches!(tokio::time::timeout(SYNC_TIMEOUT, answered).await, Ok(Ok(())));
    if !acknowledged {
        hub.forget_sync(token);
        tracing::warn!(peer = %conn.peer(), "event publisher did not acknowledge subscriptions within {SYNC_TIMEOUT:?}");
    }
}

fn subscribe_frame(id: u64, subject: &str) -> Frame {
    let header = serde_json::to_vec(&serde_json::json!({"subject": subject})).unwrap_or_default();
    Frame::with_header(FrameKind::Subscribe, id, header.into(), Bytes::new())
}

struct Unsubscribe {
    hub: Arc<EventHub>,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        self.hub.remove_local(self.id);
    }
}

//! The embedded backend of the event plane. A process that publishes registers its
//! address under `v1/event_publishers/`; subscribers watch that prefix, connect to every
//! publisher and send their subscriptions; publishers forward matching events.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::OnceCell;

use super::Subscription;
use crate::discovery::{Discovery, WatchEvent};
use crate::error::Result;
use crate::transport::connection::Connection;
use crate::transport::frame::{Frame, FrameKind};
use crate::transport::Transport;

const PUBLISHERS_PREFIX: &str = "v1/event_publishers/";

pub struct TcpEventPlane {
    transport: Arc<Transport>,
    discovery: Arc<dyn Discovery>,
    registered: OnceCell<()>,
    watching: OnceCell<()>,
    publishers: Arc<Mutex<HashMap<String, Arc<Connection>>>>,
}

impl TcpEventPlane {
    pub(super) fn new(transport: Arc<Transport>, discovery: Arc<dyn Discovery>) -> Self {
        TcpEventPlane {
            transport,
            discovery,
            registered: OnceCell::new(),
            watching: OnceCell::new(),
            publishers: Default::default(),
        }
    }

    pub(super) async fn publish(&self, subject: &str, payload: Bytes) -> Result<()> {
        self.registered
            .get_or_try_init(|| async {
                let key = format!("{PUBLISHERS_PREFIX}{:x}", self.transport.instance_id);
                let value = serde_json::to_vec(&serde_json::json!({"address": self.transport.address()}))?;
                self.discovery.put_leased(&key, value.into()).await
            })
            .await?;
        self.transport.events.publish(subject, &payload);
        Ok(())
    }

    pub(super) async fn subscribe(&self, subject: &str) -> Result<Subscription> {
        let (id, rx) = self.transport.events.add_local(subject);
        let guard = Unsubscribe { transport: self.transport.clone(), id };
        self.watching.get_or_try_init(|| self.watch_publishers()).await?;
        let conns: Vec<Arc<Connection>> = self.publishers.lock().values().cloned().collect();
        for conn in conns {
            let _ = conn.send(subscribe_frame(id, subject)).await;
        }
        Ok(Subscription::new(rx, guard))
    }

    async fn watch_publishers(&self) -> Result<()> {
        let mut watch = self.discovery.watch_prefix(PUBLISHERS_PREFIX).await?;
        for kv in std::mem::take(&mut watch.initial) {
            connect_publisher(&self.transport, &self.publishers, &kv.key, &kv.value).await;
        }
        let transport = self.transport.clone();
        let publishers = self.publishers.clone();
        let cancel = transport.cancel.clone();
        self.transport.tracker.spawn(async move {
            loop {
                let event = tokio::select! {
                    e = watch.events.recv() => e,
                    _ = cancel.cancelled() => return,
                };
                match event {
                    Some(WatchEvent::Put(kv)) => connect_publisher(&transport, &publishers, &kv.key, &kv.value).await,
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
    publishers: &Mutex<HashMap<String, Arc<Connection>>>,
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
            for (id, pattern) in transport.events.local_subscriptions() {
                let _ = conn.send(subscribe_frame(id, &pattern)).await;
            }
            publishers.lock().insert(key.to_string(), conn);
        }
        Err(e) => tracing::warn!(address, error = %e, "cannot reach event publisher"),
    }
}

fn subscribe_frame(id: u64, subject: &str) -> Frame {
    let header = serde_json::to_vec(&serde_json::json!({"subject": subject})).unwrap_or_default();
    Frame::with_header(FrameKind::Subscribe, id, header.into(), Bytes::new())
}

struct Unsubscribe {
    transport: Arc<Transport>,
    id: u64,
}

impl Drop for Unsubscribe {
    fn drop(&mut self) {
        self.transport.events.remove_local(self.id);
    }
}

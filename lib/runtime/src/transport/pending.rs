//! The caller role of the transport: the table of response streams this process awaits,
//! and delivering the frames that arrive for them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::Deserialize;
use tokio::sync::mpsc;

use super::frame::{Frame, FrameKind};
use super::link::Link;
use super::Transport;
use crate::error::{Error, ErrorKind, Result};
use super::response_stream::{ResponseItem, ResponseStream, StreamEvent};

/// Items buffered per awaited stream before the connection's reader waits for the consumer.
const STREAM_BUFFER: usize = 1024;

struct Pending {
    tx: mpsc::Sender<StreamEvent>,
    conn: Option<Arc<Link>>,
    /// For a stream not yet bound to a connection: when to give up on the worker.
    deadline: Option<Instant>,
}

/// The awaited streams by stream id, and the counter that numbers them.
pub(super) struct PendingStreams {
    next_stream: AtomicU64,
    streams: Mutex<HashMap<u64, Pending>>,
}

impl Default for PendingStreams {
    fn default() -> Self {
        PendingStreams { next_stream: AtomicU64::new(1), streams: Mutex::new(HashMap::new()) }
    }
}

impl Transport {
    /// Register a stream to await; `conn` is where it arrives, if already known.
    pub(crate) fn open_stream(self: &Arc<Self>, conn: Option<&Arc<Link>>) -> Result<ResponseStream> {
        let id = self.pending.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        if let Some(c) = conn {
            c.bind(id)?;
        }
        let deadline = conn.is_none().then(|| Instant::now() + self.config.response_timeout);
        self.pending.streams.lock().insert(id, Pending { tx, conn: conn.cloned(), deadline });
        Ok(ResponseStream::new(id, rx, self.clone()))
    }

    /// Deliver a response frame to the stream awaiting it.
    pub(super) async fn route_response(self: &Arc<Self>, conn: &Arc<Link>, frame: Frame) {
        let id = frame.stream;
        let event = match frame.kind {
            FrameKind::Item => StreamEvent::Item(ResponseItem { header: frame.header, body: frame.body }),
            FrameKind::End => StreamEvent::End,
            _ => StreamEvent::Error(decode_error(&frame.header)),
        };
        let terminal = !matches!(event, StreamEvent::Item(_));
        let tx = {
            let mut pending = self.pending.streams.lock();
            if terminal {
                pending.remove(&id).map(|p| p.tx)
            } else {
                pending.get(&id).map(|p| p.tx.clone())
            }
        };
        if terminal {
            conn.unbind(id);
        }
        let delivered = match tx {
            Some(tx) => tx.send(event).await.is_ok(),
            None => false,
        };
        if !delivered && !terminal {
            // Nobody reads this stream any more: tell the worker to drop it.
            self.abandon(id);
            conn.send_reliably(Frame::control(FrameKind::Kill, id));
        }
    }

    /// The worker took stream `id` and will answer on `conn` (NATS plane).
    pub(super) fn on_start(&self, conn: &Arc<Link>, id: u64) {
        let mut pending = self.pending.streams.lock();
        match pending.get_mut(&id) {
            Some(p) if conn.bind(id).is_ok() => p.conn = Some(conn.clone()),
            _ => {
                drop(pending);
                conn.send_reliably(Frame::control(FrameKind::Kill, id));
            }
        }
    }

    /// End an awaited stream with `error` (connection lost, timeout).
    pub(crate) fn fail_pending(&self, id: u64, error: Error) {
        if let Some(p) = self.pending.streams.lock().remove(&id) {
            if let Some(c) = &p.conn {
                c.unbind(id);
            }
            let _ = p.tx.try_send(StreamEvent::Error(error));
        }
    }

    /// End every stream whose worker has not connected back within the response timeout.
    pub(crate) fn fail_expired(&self) {
        let now = Instant::now();
        let expired: Vec<u64> = self
            .pending
            .streams
            .lock()
            .iter()
            .filter(|(_, p)| p.conn.is_none() && p.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.fail_pending(
                id,
                Error::new(
                    ErrorKind::NotTaken,
                    format!("no worker took the request within {:?} (DYN_RESPONSE_TIMEOUT)", self.config.response_timeout),
                ),
            );
        }
    }

    /// End every stream no worker has taken yet (NATS plane) with `error`.
    pub(crate) fn fail_unbound(&self, error: Error) {
        let unbound: Vec<u64> =
            self.pending.streams.lock().iter().filter(|(_, p)| p.conn.is_none()).map(|(id, _)| *id).collect();
        for id in unbound {
            self.fail_pending(id, error.clone());
        }
    }

    /// End every awaited stream: the runtime is shutting down.
    pub(crate) fn fail_all_pending(&self) {
        let pending: Vec<Pending> = self.pending.streams.lock().drain().map(|(_, p)| p).collect();
        for p in pending {
            let _ = p.tx.try_send(StreamEvent::Error(Error::new(ErrorKind::Shutdown, "the runtime shut down")));
        }
    }

    /// Whether stream `id` is awaited but not yet bound to a connection.
    pub(crate) fn is_unbound(&self, id: u64) -> bool {
        self.pending.streams.lock().get(&id).map(|p| p.conn.is_none()).unwrap_or(false)
    }

    /// Send Stop or Kill for an awaited stream to the worker serving it.
    pub(crate) fn control(&self, id: u64, kind: FrameKind) {
        let conn = self.pending.streams.lock().get(&id).and_then(|p| p.conn.clone());
        if let Some(conn) = conn {
            conn.send_reliably(Frame::control(kind, id));
        }
    }

    /// The caller dropped stream `id`: forget it and kill it on the worker.
    pub(crate) fn abandon(&self, id: u64) {
        let removed = self.pending.streams.lock().remove(&id);
        if let Some(Pending { conn: Some(conn), .. }) = removed {
            conn.unbind(id);
            conn.send_reliably(Frame::control(FrameKind::Kill, id));
        }
    }
}

fn decode_error(header: &[u8]) -> Error {
    #[derive(Deserialize)]
    struct ErrorHeader {
        kind: String,
        message: String,
    }
    match serde_json::from_slice::<ErrorHeader>(header) {
        Ok(h) => Error::new(ErrorKind::parse(&h.kind), h.message),
        Err(_) => Error::new(ErrorKind::Protocol, format!("malformed error frame: {}", String::from_utf8_lossy(header))),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::transport::TransportConfig;

    #[tokio::test]
    async fn a_stream_no_worker_took_in_time_fails_as_not_taken() {
        let config = TransportConfig {
            max_message_size: 1 << 20,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_millis(50),
            ping_interval: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(6),
        };
        let cancel = CancellationToken::new();
        let transport = Transport::bind(config, 1, "127.0.0.1", 0, cancel.clone(), TaskTracker::new()).await.unwrap();
        let mut stream = transport.open_stream(None).unwrap();
        transport.fail_expired();
        assert!(transport.is_unbound(stream.id()), "failed before its response timeout");
        tokio::time::sleep(Duration::from_millis(60)).await;
        transport.fail_expired();
        let err = stream.next().await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotTaken, "{err}");
        assert!(err.message().contains("DYN_RESPONSE_TIMEOUT"), "{err}");
        cancel.cancel();
    }
}

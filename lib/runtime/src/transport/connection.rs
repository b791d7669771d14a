//! One TCP connection between two runtimes: a reader task that routes incoming frames,
//! and a writer task that batches outgoing frames into few syscalls.
//!
//! A connection is symmetric: whichever side opened it, requests, responses, control
//! and events can flow on it. What it carries is decided by the frames.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::BytesMut;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;

use super::frame::{Frame, FrameKind, PROTOCOL_VERSION};
use super::liveness::{self, Liveness};
use super::Transport;
use crate::context::RequestContext;
use crate::error::{Error, ErrorKind, Result};

/// Frames queued for the writer before senders must wait.
const WRITE_QUEUE: usize = 4096;
/// The writer stops batching once a batch reaches this size.
const WRITE_BATCH_BYTES: usize = 256 * 1024;

/// Bound on flushing queued frames when a connection closes.
const FLUSH_ON_CLOSE: std::time::Duration = std::time::Duration::from_secs(1);

/// Kernel TCP keepalive, a second line behind the application-level ping: idle time
/// before the first probe, and between probes.
const TCP_KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(10);
const TCP_KEEPALIVE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

static NEXT_CONNECTION_ID: AtomicU64 = AtomicU64::new(1);

/// Why a frame could not be queued without waiting.
#[derive(Debug)]
pub enum TrySendError {
    /// The write queue is full; the frame is handed back.
    Full(Frame),
    /// The connection is closed.
    Closed,
}

/// A live connection. Dropping the last handle does not close it; [`Connection::close`] does.
pub struct Connection {
    id: u64,
    peer: String,
    /// Whether this side opened the connection (it is then pooled by peer address).
    outbound: bool,
    tx: mpsc::Sender<Frame>,
    pub(super) liveness: Liveness,
    closed: CancellationToken,
    /// Streams this side serves on this connection (worker role); `None` once closed.
    running: Mutex<Option<HashMap<u64, RequestContext>>>,
    /// Streams this side awaits on this connection (caller role); `None` once closed.
    bound: Mutex<Option<HashSet<u64>>>,
    /// The peer's instance id, from its Hello (inbound connections only).
    peer_instance: OnceLock<u64>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("id", &self.id).field("peer", &self.peer).finish()
    }
}

impl Connection {
    /// Start the reader and writer tasks for an established socket. `outbound` connections
    /// send the Hello frame first; inbound ones expect it.
    pub(crate) fn spawn(transport: &Arc<Transport>, socket: TcpStream, peer: String, outbound: bool) -> Arc<Connection> {
        let _ = socket.set_nodelay(true);
        set_tcp_keepalive(&socket);
        let (read, mut write) = socket.into_split();
        let (tx, mut rx) = mpsc::channel::<Frame>(WRITE_QUEUE);
        let conn = Arc::new(Connection {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            peer,
            outbound,
            tx,
            liveness: Liveness::new(),
            closed: transport.cancel.child_token(),
            running: Mutex::new(Some(HashMap::new())),
            bound: Mutex::new(Some(HashSet::new())),
            peer_instance: OnceLock::new(),
        });
        if outbound {
            let hello = serde_json::json!({"version": PROTOCOL_VERSION, "instance_id": transport.instance_id});
            let _ = conn.tx.try_send(Frame::with_header(
                FrameKind::Hello,
                0,
                serde_json::to_vec(&hello).unwrap_or_default().into(),
                Default::default(),
            ));
        }

        let writer_conn = conn.clone();
        transport.tracker.spawn(async move {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            loop {
                let first = tokio::select! {
                    f = rx.recv() => f,
                    _ = writer_conn.closed.cancelled() => None,
                };
                let Some(first) = first else { break };
                buf.clear();
                first.encode(&mut buf);
                while buf.len() < WRITE_BATCH_BYTES {
                    match rx.try_recv() {
                        Ok(f) => f.encode(&mut buf),
                        Err(_) => break,
                    }
                }
                if let Err(e) = write.write_all(&buf).await {
                    tracing::debug!(peer = %writer_conn.peer, error = %e, "write failed; closing connection");
                    writer_conn.closed.cancel();
                    break;
                }
                writer_conn.liveness.wrote();
            }
            // Closing (shutdown, or the reader saw EOF): flush what is queued, so a drained
            // stream's last items and end marker still reach the caller. Bounded.
            let mut tail = BytesMut::new();
            while let Ok(f) = rx.try_recv() {
                f.encode(&mut tail);
            }
            if !tail.is_empty() {
                let _ = tokio::time::timeout(FLUSH_ON_CLOSE, write.write_all(&tail)).await;
            }
            let _ = write.shutdown().await;
        });

        let reader_conn = conn.clone();
        let reader_transport = transport.clone();
        transport.tracker.spawn(async move {
            let codec = LengthDelimitedCodec::builder()
                .length_field_length(4)
                .max_frame_length(reader_transport.config.max_message_size)
                .new_codec();
            let mut frames = FramedRead::new(read, codec);
            let mut greeted = outbound;
            let reason = loop {
                let next = tokio::select! {
                    n = frames.next() => n,
                    _ = reader_conn.closed.cancelled() => break "connection closed".to_string(),
                };
                let raw = match next {
                    None => break "peer closed the connection".to_string(),
                    Some(Err(e)) => break format!("read failed: {e}"),
                    Some(Ok(raw)) => raw,
                };
                reader_conn.liveness.heard();
                let frame = match Frame::decode(raw.freeze()) {
                    Ok(f) => f,
                    Err(e) => break format!("protocol error: {e}"),
                };
                if !greeted {
                    match check_hello(&frame) {
                        Ok(instance) => {
                            let _ = reader_conn.peer_instance.set(instance);
                            greeted = true;
                            continue;
                        }
                        Err(e) => break e.to_string(),
                    }
                }
                match frame.kind {
                    // Answered here, on the reader task, so that a busy handler (or a
                    // Python worker holding the GIL) never delays it.
                    FrameKind::Ping => {
                        let _ = reader_conn.try_send(Frame::control(FrameKind::Pong, 0));
                    }
                    FrameKind::Pong => reader_conn.liveness.pong_received(),
                    _ => {
                        reader_conn.liveness.set_reader_busy(true);
                        reader_transport.route(&reader_conn, frame).await;
                        reader_conn.liveness.set_reader_busy(false);
                    }
                }
            };
            reader_conn.close_with(&reader_transport, &reason);
        });
        liveness::spawn_keepalive(transport, &conn);
        conn
    }

    /// Send a Ping and wait for the peer's Pong; false if none came within `timeout` or
    /// the connection closed.
    pub(crate) async fn ping(&self, timeout: std::time::Duration) -> bool {
        self.liveness.await_pong(|| self.try_send(Frame::control(FrameKind::Ping, 0)).is_ok(), timeout).await
    }

    /// Whether this side opened the connection.
    pub(crate) fn is_outbound(&self) -> bool {
        self.outbound
    }

    pub(super) fn closed_token(&self) -> &CancellationToken {
        &self.closed
    }

    /// A process-unique id of this connection.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The remote address.
    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// The peer's instance id, known on an inbound connection once its Hello arrived.
    pub(crate) fn peer_instance(&self) -> Option<u64> {
        self.peer_instance.get().copied()
    }

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Queue a frame, waiting for queue space.
    pub async fn send(&self, frame: Frame) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        tokio::select! {
            r = self.tx.send(frame) => r.map_err(|_| self.closed_error()),
            _ = self.closed.cancelled() => Err(self.closed_error()),
        }
    }

    /// Queue a frame without waiting.
    pub fn try_send(&self, frame: Frame) -> std::result::Result<(), TrySendError> {
        if self.is_closed() {
            return Err(TrySendError::Closed);
        }
        self.tx.try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(f) => TrySendError::Full(f),
            mpsc::error::TrySendError::Closed(_) => TrySendError::Closed,
        })
    }

    /// Wait until the write queue has room for one frame.
    pub async fn send_ready(&self) -> Result<()> {
        tokio::select! {
            r = self.tx.reserve() => r.map(|_| ()).map_err(|_| self.closed_error()),
            _ = self.closed.cancelled() => Err(self.closed_error()),
        }
    }

    /// Queue a frame that must not be dropped (End, Error, Kill): waits in a task if full.
    pub(crate) fn send_reliably(self: &Arc<Self>, transport: &Transport, frame: Frame) {
        if let Err(TrySendError::Full(frame)) = self.try_send(frame) {
            let conn = self.clone();
            transport.tracker.spawn(async move {
                let _ = conn.send(frame).await;
            });
        }
    }

    fn closed_error(&self) -> Error {
        Error::new(ErrorKind::Disconnected, format!("connection to {} is closed", self.peer))
    }

    /// Close the connection: fail every stream awaited on it and kill every stream served on it.
    pub(crate) fn close_with(&self, transport: &Transport, reason: &str) {
        // Take the streams before waking the reader and writer, so that the first
        // closer's reason is the one the streams report (the reader, woken, closes too).
        let bound = self.bound.lock().take().unwrap_or_default();
        let running = self.running.lock().take().unwrap_or_default();
        self.closed.cancel();
        if !bound.is_empty() || !running.is_empty() {
            tracing::warn!(peer = %self.peer, reason, awaited = bound.len(), served = running.len(), "connection lost");
        } else {
            tracing::debug!(peer = %self.peer, reason, "connection closed");
        }
        for id in bound {
            transport.fail_pending(
                id,
                Error::new(ErrorKind::Disconnected, format!("connection to {} lost mid-stream: {reason}", self.peer)),
            );
        }
        for ctx in running.into_values() {
            ctx.kill();
        }
        transport.frame_handlers.connection_closed(self.id);
        transport.forget_connection(self);
    }

    /// Record that stream `id` (awaited by this side) arrives on this connection.
    /// Fails if the connection is already closed.
    pub(crate) fn bind(&self, id: u64) -> Result<()> {
        match self.bound.lock().as_mut() {
            Some(set) => {
                set.insert(id);
                Ok(())
            }
            None => Err(self.closed_error()),
        }
    }

    pub(crate) fn unbind(&self, id: u64) {
        if let Some(set) = self.bound.lock().as_mut() {
            set.remove(&id);
        }
    }

    /// Record a stream this side serves; fails if the connection is closed.
    pub(crate) fn add_running(&self, id: u64, ctx: RequestContext) -> Result<()> {
        match self.running.lock().as_mut() {
            Some(map) => {
                map.insert(id, ctx);
                Ok(())
            }
            None => Err(self.closed_error()),
        }
    }

    pub(crate) fn remove_running(&self, id: u64) {
        if let Some(map) = self.running.lock().as_mut() {
            map.remove(&id);
        }
    }

    pub(crate) fn running(&self, id: u64) -> Option<RequestContext> {
        self.running.lock().as_ref().and_then(|m| m.get(&id).cloned())
    }
}

fn set_tcp_keepalive(socket: &TcpStream) {
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE_IDLE).with_interval(TCP_KEEPALIVE_INTERVAL);
    if let Err(e) = socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot enable TCP keepalive");
    }
}

/// Check a Hello frame; returns the peer's instance id.
fn check_hello(frame: &Frame) -> Result<u64> {
    if frame.kind != FrameKind::Hello {
        return Err(Error::new(ErrorKind::Protocol, format!("expected Hello, got {:?}", frame.kind)));
    }
    let hello: serde_json::Value = serde_json::from_slice(&frame.header)?;
    let version = hello.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version != PROTOCOL_VERSION as u64 {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("peer speaks protocol version {version}, this runtime speaks {PROTOCOL_VERSION}"),
        ));
    }
    Ok(hello.get("instance_id").and_then(|v| v.as_u64()).unwrap_or(0))
}

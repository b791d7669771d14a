//! One TCP connection between two runtimes, as a framed socket: frames queued with
//! [`Connection::send`] go out through a writer task that batches them into few
//! syscalls; frames that arrive are read one at a time with [`FrameReader::read_frame`]
//! by the connection's owner (the transport's `reader.rs`), which decides what they
//! mean. It knows nothing of the streams, events or pool its frames belong to.
//!
//! A connection is symmetric: whichever side opened it, requests, responses, control
//! and events can flow on it. What it carries is decided by the frames.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::BytesMut;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::codec::{FramedRead, LengthDelimitedCodec};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::frame::{Frame, FrameKind};
use super::liveness::Liveness;
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

/// The sending half of a live connection, and its state. Closed by [`Connection::close`],
/// by a failed write, or when the runtime's root token is cancelled.
pub struct Connection {
    id: u64,
    peer: String,
    /// Whether this side opened the connection (it is then pooled by peer address).
    outbound: bool,
    tx: mpsc::Sender<Frame>,
    liveness: Arc<Liveness>,
    closed: CancellationToken,
    /// Owns the writer task and the tasks of [`Connection::send_reliably`].
    tracker: TaskTracker,
}

/// The receiving half of a connection: the frames the peer sends, in order.
pub(crate) struct FrameReader {
    frames: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    liveness: Arc<Liveness>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection").field("id", &self.id).field("peer", &self.peer).finish()
    }
}

impl Connection {
    /// Start the writer task of an established socket; the [`FrameReader`] yields what
    /// the peer sends. Frames larger than `max_frame` are a read error. The connection
    /// closes with `parent` (a child token of it is its closed signal).
    pub(crate) fn open(
        socket: TcpStream,
        peer: String,
        outbound: bool,
        max_frame: usize,
        parent: &CancellationToken,
        tracker: &TaskTracker,
    ) -> (Connection, FrameReader) {
        let _ = socket.set_nodelay(true);
        set_tcp_keepalive(&socket);
        let (read, write) = socket.into_split();
        let (tx, rx) = mpsc::channel::<Frame>(WRITE_QUEUE);
        let conn = Connection {
            id: NEXT_CONNECTION_ID.fetch_add(1, Ordering::Relaxed),
            peer,
            outbound,
            tx,
            liveness: Arc::new(Liveness::new()),
            closed: parent.child_token(),
            tracker: tracker.clone(),
        };
        tracker.spawn(write_frames(rx, write, conn.closed.clone(), conn.liveness.clone(), conn.peer.clone()));
        let codec = LengthDelimitedCodec::builder().length_field_length(4).max_frame_length(max_frame).new_codec();
        let reader = FrameReader { frames: FramedRead::new(read, codec), liveness: conn.liveness.clone() };
        (conn, reader)
    }

    /// Send a Ping and wait for the peer's Pong; false if none came within `timeout` or
    /// the connection closed.
    pub(crate) async fn ping(&self, timeout: std::time::Duration) -> bool {
        self.liveness.await_pong(|| self.try_send(Frame::control(FrameKind::Ping, 0)).is_ok(), timeout).await
    }

    /// When the peer was last heard from and written to (see `keepalive.rs`).
    pub(crate) fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// Whether this side opened the connection.
    pub(crate) fn is_outbound(&self) -> bool {
        self.outbound
    }

    /// Cancelled once the connection is closed.
    pub(crate) fn closed_token(&self) -> &CancellationToken {
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

    /// Whether the connection is closed.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Close the connection: the writer flushes what is queued (bounded) and shuts the
    /// socket down; the owner's reader stops.
    pub(crate) fn close(&self) {
        self.closed.cancel();
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
    pub(crate) fn send_reliably(&self, frame: Frame) {
        if let Err(TrySendError::Full(frame)) = self.try_send(frame) {
            let (tx, closed) = (self.tx.clone(), self.closed.clone());
            self.tracker.spawn(async move {
                tokio::select! {
                    _ = tx.send(frame) => {}
                    _ = closed.cancelled() => {}
                }
            });
        }
    }

    /// The error of an operation on a closed connection.
    pub(crate) fn closed_error(&self) -> Error {
        Error::new(ErrorKind::Disconnected, format!("connection to {} is closed", self.peer))
    }
}

impl FrameReader {
    /// The next frame from the peer; `None` once the peer closed the connection. A
    /// failed read is `Disconnected`, a frame that does not decode `Protocol`.
    pub(crate) async fn read_frame(&mut self) -> Result<Option<Frame>> {
        let raw = match self.frames.next().await {
            None => return Ok(None),
            Some(Err(e)) => return Err(Error::new(ErrorKind::Disconnected, format!("read failed: {e}"))),
            Some(Ok(raw)) => raw,
        };
        self.liveness.heard();
        match Frame::decode(raw.freeze()) {
            Ok(frame) => Ok(Some(frame)),
            Err(e) => Err(Error::new(ErrorKind::Protocol, format!("protocol error: {e}"))),
        }
    }
}

/// The writer task: batch queued frames into few writes until the connection closes,
/// then flush what is still queued (bounded) so that a drained stream's last items and
/// end marker still reach the peer.
async fn write_frames(
    mut rx: mpsc::Receiver<Frame>,
    mut write: tokio::net::tcp::OwnedWriteHalf,
    closed: CancellationToken,
    liveness: Arc<Liveness>,
    peer: String,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    loop {
        let first = tokio::select! {
            f = rx.recv() => f,
            _ = closed.cancelled() => None,
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
            tracing::debug!(peer = %peer, error = %e, "write failed; closing connection");
            closed.cancel();
            break;
        }
        liveness.wrote();
    }
    let mut tail = BytesMut::new();
    while let Ok(f) = rx.try_recv() {
        f.encode(&mut tail);
    }
    if !tail.is_empty() {
        let _ = tokio::time::timeout(FLUSH_ON_CLOSE, write.write_all(&tail)).await;
    }
    let _ = write.shutdown().await;
}

fn set_tcp_keepalive(socket: &TcpStream) {
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE_IDLE).with_interval(TCP_KEEPALIVE_INTERVAL);
    if let Err(e) = socket2::SockRef::from(socket).set_tcp_keepalive(&keepalive) {
        tracing::debug!(error = %e, "cannot enable TCP keepalive");
    }
}

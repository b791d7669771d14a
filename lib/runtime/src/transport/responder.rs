//! The worker side of a request: the handler trait and the [`Responder`] it writes to.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::connection::TrySendError;
use super::frame::{Frame, FrameKind};
use super::inflight::InflightEntry;
use super::link::Link;
use crate::context::RequestContext;
use crate::error::{ErrorKind, Result};
use crate::metrics::EndpointMetrics;

/// A request as it arrives at a worker.
#[derive(Debug)]
pub struct IncomingRequest {
    /// The payload, usually JSON.
    pub body: Bytes,
    /// Id and cancellation state.
    pub context: RequestContext,
}

/// Serves requests of one endpoint.
///
/// `handle` is called on the connection's reader task and must not block: start the
/// work (spawn a task, or hand it to another event loop) and return.
pub trait RequestHandler: Send + Sync + 'static {
    /// Start serving `request`, writing the response stream to `responder`.
    fn handle(&self, request: IncomingRequest, responder: Responder);
}

impl<F> RequestHandler for F
where
    F: Fn(IncomingRequest, Responder) + Send + Sync + 'static,
{
    fn handle(&self, request: IncomingRequest, responder: Responder) {
        self(request, responder)
    }
}

/// Why an item could not be sent.
#[derive(Debug)]
pub enum SendError {
    /// The connection's write queue is full: wait with [`Responder::ready`] and retry
    /// with the returned item.
    Full(Bytes, Bytes),
    /// The caller is gone or killed the stream: stop generating.
    Closed,
}

/// Writes one response stream back to the caller. Dropping it without [`Responder::finish`]
/// or [`Responder::error`] ends the stream with an error, so a caller never waits forever.
pub struct Responder {
    conn: Arc<Link>,
    stream: u64,
    context: RequestContext,
    metrics: Arc<EndpointMetrics>,
    started: Instant,
    done: bool,
    /// In the endpoint's set of streams in flight until dropped.
    _inflight: InflightEntry,
}

impl Responder {
    pub(crate) fn new(
        conn: Arc<Link>,
        stream: u64,
        context: RequestContext,
        metrics: Arc<EndpointMetrics>,
        inflight: InflightEntry,
    ) -> Self {
        metrics.request_started();
        Responder { conn, stream, context, metrics, started: Instant::now(), done: false, _inflight: inflight }
    }

    /// The request's context.
    pub fn context(&self) -> &RequestContext {
        &self.context
    }

    /// Queue an item (`header`: optional annotations JSON, `body`: the data) without waiting.
    pub fn try_send(&self, header: Bytes, body: Bytes) -> std::result::Result<(), SendError> {
        if self.context.is_killed() {
            return Err(SendError::Closed);
        }
        match self.conn.try_send(Frame::with_header(FrameKind::Item, self.stream, header, body)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(f)) => Err(SendError::Full(f.header, f.body)),
            Err(TrySendError::Closed) => Err(SendError::Closed),
        }
    }

    /// Queue an item, waiting for queue space.
    pub async fn send(&self, header: Bytes, body: Bytes) -> Result<()> {
        if self.context.is_killed() {
            return Err(crate::Error::new(ErrorKind::Disconnected, "the caller killed the stream"));
        }
        self.conn.send(Frame::with_header(FrameKind::Item, self.stream, header, body)).await
    }

    /// Wait until the write queue has room (or the connection closed).
    pub async fn ready(&self) {
        // A permit is the only way to wait for room in a tokio channel; releasing it at
        // once is fine because the retry that follows will usually find room.
        let _ = self.conn.send_ready().await;
    }

    /// End the stream normally (unless it was killed: the caller is gone, or a drain's
    /// deadline ended it with an error already).
    pub fn finish(mut self) {
        self.done = true;
        if !self.context.is_killed() {
            self.conn.send_reliably(Frame::control(FrameKind::End, self.stream));
        }
    }

    /// End the stream with an error the caller will see with `kind` and `message`.
    pub fn error(mut self, kind: ErrorKind, message: &str) {
        self.done = true;
        self.metrics.request_failed();
        self.send_error(kind, message);
    }

    fn send_error(&self, kind: ErrorKind, message: &str) {
        let header = serde_json::json!({"kind": kind.as_str(), "message": message});
        self.conn.send_reliably(
            Frame::with_header(FrameKind::Error, self.stream, serde_json::to_vec(&header).unwrap_or_default().into(), Bytes::new()),
        );
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if !self.done {
            self.metrics.request_failed();
            if !self.context.is_killed() {
                self.send_error(ErrorKind::Handler, "the handler ended without finishing the stream");
            }
        }
        self.conn.remove_running(self.stream);
        self.metrics.request_finished(self.started.elapsed());
    }
}

//! The caller side of a request: the stream of response items.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

use crate::error::{Error, ErrorKind, Result};
use crate::transport::frame::FrameKind;
use crate::transport::Transport;

/// One response item: optional annotations (JSON header) and the data (JSON body).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseItem {
    /// Annotations JSON (`{"event":..,"comment":[..],"id":..}`), empty when none.
    pub header: Bytes,
    /// The item's data, usually JSON; empty for annotation-only items.
    pub body: Bytes,
}

#[derive(Debug)]
pub(crate) enum StreamEvent {
    Item(ResponseItem),
    End,
    Error(Error),
}

/// Re-sends a request elsewhere; set by the client for routing modes that may switch
/// instance.
pub(crate) type Resend = Box<dyn FnOnce() -> BoxFuture<'static, Result<ResponseStream>> + Send>;

/// How long a stream may wait for its first item and between two items; `None` waits
/// forever.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct StreamBounds {
    pub first_item: Option<Duration>,
    pub item: Option<Duration>,
}

/// Stands for "no deadline" in the one timer a bounded stream keeps.
const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// The items of one response stream, in order. Ends with `None` after the worker's end
/// marker, or yields one `Err` (handler error, worker gone, timeout) and then `None`.
///
/// Dropping it before the end kills the stream on the worker.
pub struct ResponseStream {
    id: u64,
    rx: mpsc::Receiver<StreamEvent>,
    transport: Arc<Transport>,
    done: bool,
    yielded: bool,
    resend: Option<Resend>,
    resending: Option<BoxFuture<'static, Result<ResponseStream>>>,
    /// Why the request is being resent: reported if no other instance is left.
    resend_cause: Option<Error>,
    bounds: StreamBounds,
    /// Fires when the current bound (first item, then item gap) may have run out. Items
    /// after the first do not re-arm it (a timer-wheel update per item costs); they only
    /// note their arrival, and a firing timer that finds a recent item moves itself on.
    deadline: Option<Pin<Box<Sleep>>>,
    /// When the last item arrived (kept only for a bounded stream).
    last_item: Instant,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream").field("id", &self.id).field("done", &self.done).finish()
    }
}

impl ResponseStream {
    pub(crate) fn new(id: u64, rx: mpsc::Receiver<StreamEvent>, transport: Arc<Transport>) -> Self {
        ResponseStream {
            id,
            rx,
            transport,
            done: false,
            yielded: false,
            resend: None,
            resending: None,
            resend_cause: None,
            bounds: StreamBounds::default(),
            deadline: None,
            last_item: Instant::now(),
        }
    }

    /// Bound the wait for the first item and between items from now on.
    pub(crate) fn set_bounds(&mut self, bounds: StreamBounds) {
        self.bounds = bounds;
        self.deadline = match (bounds.first_item, bounds.item) {
            (None, None) => None,
            (first, _) => Some(Box::pin(tokio::time::sleep(first.unwrap_or(FAR)))),
        };
    }

    /// If the instance refuses the request or the connection breaks before any item (it
    /// is shutting down, died, stopped answering pings), send it again with `resend`
    /// instead of failing. A request is never resent once an item was delivered.
    pub(crate) fn set_resend(&mut self, resend: Resend) {
        self.resend = Some(resend);
    }

    /// The process-local stream id.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether the stream has ended (normally or with an error).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Ask the worker to stop generating; items already sent still arrive, then the end.
    pub fn stop_generating(&self) {
        if !self.done {
            self.transport.control(self.id, FrameKind::Stop);
        }
    }

    /// Abandon the stream now: the worker drops it and this stream ends.
    pub fn kill(&mut self) {
        if !self.done {
            self.done = true;
            self.transport.abandon(self.id);
        }
    }

    /// Poll for the next item; the same contract as [`Stream::poll_next`].
    pub fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<ResponseItem>>> {
        if let Some(resending) = self.resending.as_mut() {
            return match resending.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Ok(replacement)) => {
                    // The old stream is done; dropping it sends nothing.
                    drop(std::mem::replace(self, replacement));
                    self.poll_item(cx)
                }
                Poll::Ready(Err(e)) => {
                    self.resending = None;
                    self.done = true;
                    // No other instance to go to: the first failure says what happened.
                    let cause = self.resend_cause.take();
                    Poll::Ready(Some(Err(match cause {
                        Some(cause) if e.kind() == ErrorKind::NoInstances => cause,
                        _ => e,
                    })))
                }
            };
        }
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => self.poll_deadline(cx),
            Poll::Ready(Some(StreamEvent::Item(item))) => {
                if self.deadline.is_some() {
                    let now = Instant::now();
                    self.last_item = now;
                    if !self.yielded {
                        // From the first item on, the gap bound applies.
                        let gap = self.bounds.item.unwrap_or(FAR);
                        if let Some(deadline) = self.deadline.as_mut() {
                            deadline.as_mut().reset(now + gap);
                        }
                    }
                }
                self.yielded = true;
                Poll::Ready(Some(Ok(item)))
            }
            Poll::Ready(Some(StreamEvent::End)) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(StreamEvent::Error(e))) => {
                self.done = true;
                if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Disconnected) && !self.yielded {
                    if let Some(resend) = self.resend.take() {
                        tracing::debug!(error = %e, "instance refused or lost the request before any item; sending it elsewhere");
                        self.resending = Some(resend());
                        self.resend_cause = Some(e);
                        return self.poll_item(cx);
                    }
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(Some(Err(Error::new(ErrorKind::Disconnected, "the response stream ended without an end marker"))))
            }
        }
    }
}

impl ResponseStream {
    /// The stream has nothing now: fail it if its current bound ran out. A stream that
    /// timed out is not resent (the worker may still be working on it): it is killed.
    fn poll_deadline(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<ResponseItem>>> {
        let gap = if self.yielded { self.bounds.item } else { None };
        let last_item = self.last_item;
        let Some(deadline) = self.deadline.as_mut() else { return Poll::Pending };
        loop {
            if deadline.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            // Items arrived since the timer was armed: the gap is counted from the last.
            match gap.map(|g| last_item + g) {
                Some(due) if due > Instant::now() => deadline.as_mut().reset(due),
                _ => break,
            }
        }
        let message = match (self.yielded, self.bounds.first_item, self.bounds.item) {
            (false, Some(t), _) => format!(
                "no response item within {} s of sending the request (first-item timeout, DYN_STREAM_FIRST_ITEM_TIMEOUT)",
                t.as_secs_f64()
            ),
            (_, _, Some(t)) => format!(
                "no response item for {} s after the previous one (item timeout, DYN_STREAM_ITEM_TIMEOUT)",
                t.as_secs_f64()
            ),
            _ => "the response stream timed out".to_string(),
        };
        self.deadline = None;
        self.kill();
        Poll::Ready(Some(Err(Error::new(ErrorKind::Timeout, message))))
    }
}

impl Stream for ResponseStream {
    type Item = Result<ResponseItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_item(cx)
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        if !self.done {
            self.transport.abandon(self.id);
        }
    }
}

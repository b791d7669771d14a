//! A reader of a detached generation: the buffered events after its cursor, then the
//! live ones as they come, until the stream ends. While it exists it counts as a
//! subscriber (the grace period does not run).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::sync::watch;

use super::buffer::Read;
use super::detached::Detached;
use super::error::StreamError;
use super::event::StreamEvent;

/// Events handed out per lock of the buffer.
const BATCH: usize = 64;

/// Counts a subscriber for as long as it lives.
struct SubscriberCount(Arc<Detached>);

impl SubscriberCount {
    fn new(detached: Arc<Detached>) -> Self {
        detached.subscribers.send_modify(|n| *n += 1);
        SubscriberCount(detached)
    }
}

impl Drop for SubscriberCount {
    fn drop(&mut self) {
        self.0.subscribers.send_modify(|n| *n = n.saturating_sub(1));
    }
}

struct Cursor {
    count: SubscriberCount,
    after: Option<u64>,
    ready: VecDeque<StreamEvent>,
    changed: watch::Receiver<()>,
    done: bool,
}

/// The events of a resumable stream after a given id, live to its end. An item is an
/// error only when this reader fell so far behind that the events it needs next were
/// dropped from the buffer ([`StreamError::Gone`]); the stream ends after it.
pub struct Subscription {
    request_id: String,
    inner: BoxStream<'static, Result<StreamEvent, StreamError>>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription").field("request_id", &self.request_id).finish()
    }
}

impl Subscription {
    /// A reader of `detached` after `after`; fails at once if that cursor is gone or
    /// beyond the stream's last event.
    pub(crate) fn open(detached: Arc<Detached>, after: Option<u64>) -> Result<Self, StreamError> {
        let mut changed = detached.changed.subscribe();
        changed.borrow_and_update();
        let ready = match detached.buffer.lock().read_after(after, BATCH)? {
            Read::Events(events) => events.into(),
            Read::Pending | Read::Ended => VecDeque::new(),
        };
        let request_id = detached.request_id.clone();
        let cursor = Cursor { count: SubscriberCount::new(detached), after, ready, changed, done: false };
        let inner = futures::stream::unfold(cursor, |mut cursor| async move {
            let item = cursor.next().await?;
            Some((item, cursor))
        })
        .boxed();
        Ok(Subscription { request_id, inner })
    }

    /// The stream's request id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }
}

impl Cursor {
    async fn next(&mut self) -> Option<Result<StreamEvent, StreamError>> {
        loop {
            if self.done {
                return None;
            }
            if let Some(event) = self.ready.pop_front() {
                self.after = Some(event.id);
                return Some(Ok(event));
            }
            // Mark the signal seen before reading, so a push after the read wakes us.
            self.changed.borrow_and_update();
            let read = self.count.0.buffer.lock().read_after(self.after, BATCH);
            match read {
                Ok(Read::Events(events)) => self.ready = events.into(),
                Ok(Read::Ended) => self.done = true,
                Ok(Read::Pending) => {
                    if self.changed.changed().await.is_err() {
                        self.done = true;
                    }
                }
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Stream for Subscription {
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.poll_next_unpin(cx)
    }
}

//! A runtime response stream tied to the request context of the caller: stopping the
//! context asks the worker to stop generating, killing it abandons the stream (the
//! worker's handler sees both) — at once, whether or not anyone is polling the stream.
//! Dropping the stream kills it too.

use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use futures::Stream;
use parking_lot::Mutex;

use dynamo_runtime::{ResponseItem, ResponseStream, StreamState};

use crate::engine::RequestContext;

/// A [`ResponseStream`] that follows a [`RequestContext`].
pub(crate) struct LinkedStream {
    // Shared with the context's listener, which holds it weakly so that dropping this
    // stream still drops (and so kills) the response stream.
    inner: Arc<Mutex<ResponseStream>>,
}

impl LinkedStream {
    pub(crate) fn new(inner: ResponseStream, ctx: &RequestContext) -> Self {
        let inner = Arc::new(Mutex::new(inner));
        let weak: Weak<Mutex<ResponseStream>> = Arc::downgrade(&inner);
        ctx.on_change(move |state| {
            if let Some(stream) = weak.upgrade() {
                let mut stream = stream.lock();
                match state {
                    StreamState::Live => {}
                    StreamState::Stopped => stream.stop_generating(),
                    StreamState::Killed => stream.kill(),
                }
            }
        });
        LinkedStream { inner }
    }
}

impl Stream for LinkedStream {
    type Item = dynamo_runtime::Result<ResponseItem>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.inner.lock().poll_item(cx)
    }
}

//! A runtime response stream tied to the request context of the caller: stopping the
//! context asks the worker to stop generating, killing it abandons the stream (the
//! worker's handler sees both). Dropping the stream kills it too.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};

use dynamo_runtime::{ResponseItem, ResponseStream};

use crate::engine::RequestContext;

/// A [`ResponseStream`] that follows a [`RequestContext`].
pub(crate) struct LinkedStream {
    inner: ResponseStream,
    stopped: Option<BoxFuture<'static, ()>>,
    killed: BoxFuture<'static, ()>,
    ended: bool,
}

impl LinkedStream {
    pub(crate) fn new(inner: ResponseStream, ctx: &RequestContext) -> Self {
        let (a, b) = (ctx.clone(), ctx.clone());
        LinkedStream {
            inner,
            stopped: Some(async move { a.stopped().await }.boxed()),
            killed: async move { b.killed().await }.boxed(),
            ended: false,
        }
    }
}

impl Stream for LinkedStream {
    type Item = dynamo_runtime::Result<ResponseItem>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if this.killed.poll_unpin(cx).is_ready() {
            this.ended = true;
            this.inner.kill();
            return Poll::Ready(None);
        }
        if let Some(stopped) = this.stopped.as_mut() {
            if stopped.poll_unpin(cx).is_ready() {
                this.stopped = None;
                this.inner.stop_generating();
            }
        }
        let next = Pin::new(&mut this.inner).poll_next(cx);
        if let Poll::Ready(None) = next {
            this.ended = true;
        }
        next
    }
}

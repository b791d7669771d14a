//! Requests in flight per worker, as the router counts them: a [`InflightGuard`] is
//! taken when a request is sent and released when its response stream ends or is
//! dropped ([`GuardedStream`]).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use parking_lot::Mutex;

/// In-flight request counts per worker. Cheap to clone; clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct InflightTracker {
    counts: Arc<Mutex<HashMap<u64, usize>>>,
}

impl InflightTracker {
    /// Count one more request on `worker` until the returned guard is dropped.
    pub fn start(&self, worker: u64) -> InflightGuard {
        *self.counts.lock().entry(worker).or_default() += 1;
        InflightGuard { tracker: self.clone(), worker }
    }

    /// Requests in flight on `worker`.
    pub fn get(&self, worker: u64) -> usize {
        self.counts.lock().get(&worker).copied().unwrap_or(0)
    }

    fn finish(&self, worker: u64) {
        let mut counts = self.counts.lock();
        if let Some(n) = counts.get_mut(&worker) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&worker);
            }
        }
    }
}

/// One request in flight; dropping it ends the count.
#[derive(Debug)]
pub struct InflightGuard {
    tracker: InflightTracker,
    worker: u64,
}

impl InflightGuard {
    /// The worker the request went to.
    pub fn worker(&self) -> u64 {
        self.worker
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.tracker.finish(self.worker);
    }
}

/// A stream that holds an [`InflightGuard`] until it ends or is dropped.
pub struct GuardedStream<S> {
    inner: S,
    guard: Option<InflightGuard>,
}

impl<S> GuardedStream<S> {
    /// Hold `guard` for the life of `inner`.
    pub fn new(inner: S, guard: InflightGuard) -> Self {
        GuardedStream { inner, guard: Some(guard) }
    }
}

impl<S: Stream + Unpin> Stream for GuardedStream<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = Pin::new(&mut self.inner).poll_next(cx);
        if let Poll::Ready(None) = polled {
            self.guard = None;
        }
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[test]
    fn guards_count_and_release() {
        let tracker = InflightTracker::default();
        let a = tracker.start(1);
        let b = tracker.start(1);
        assert_eq!(tracker.get(1), 2);
        assert_eq!(a.worker(), 1);
        drop(a);
        assert_eq!(tracker.get(1), 1);
        drop(b);
        assert_eq!(tracker.get(1), 0);
        assert_eq!(tracker.get(2), 0);
    }

    #[tokio::test]
    async fn the_stream_releases_at_its_end_or_when_dropped() {
        let tracker = InflightTracker::default();
        let mut ended = GuardedStream::new(futures::stream::iter([1, 2]), tracker.start(7));
        assert_eq!(ended.next().await, Some(1));
        assert_eq!(tracker.get(7), 1);
        assert_eq!(ended.next().await, Some(2));
        assert_eq!(ended.next().await, None);
        assert_eq!(tracker.get(7), 0);

        let dropped = GuardedStream::new(futures::stream::iter([1]), tracker.start(7));
        assert_eq!(tracker.get(7), 1);
        drop(dropped);
        assert_eq!(tracker.get(7), 0);
    }
}

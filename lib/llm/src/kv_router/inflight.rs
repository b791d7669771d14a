//! Requests in flight per worker, as the router counts them: an [`InflightGuard`] is
//! taken when a request is sent and released when its response stream ends or is
//! dropped ([`GuardedStream`]), which also reports the stream's timing (its first item,
//! and its mean time per item after the first) to the [`LoadTracker`] for the straggler
//! penalty.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::Stream;
use parking_lot::Mutex;

use super::scheduler::LoadTracker;

/// In-flight requests per worker, kept in a shared [`LoadTracker`]. Cheap to clone;
/// clones share the counts.
#[derive(Debug, Clone, Default)]
pub struct InflightTracker {
    load: Arc<Mutex<LoadTracker>>,
}

impl InflightTracker {
    /// Count in `load`.
    pub fn new(load: Arc<Mutex<LoadTracker>>) -> Self {
        InflightTracker { load }
    }

    /// The shared tracker.
    pub fn load(&self) -> &Arc<Mutex<LoadTracker>> {
        &self.load
    }

    /// Count one more request (of no blocks) on `worker` until the guard is dropped.
    pub fn start(&self, worker: u64) -> InflightGuard {
        self.start_with_blocks(worker, 0, None)
    }

    /// Count one more request of `blocks` KV blocks on `worker` until the guard is
    /// dropped; then also forget its sent blocks `sent` ([`LoadTracker::forget_sent`]).
    pub fn start_with_blocks(&self, worker: u64, blocks: u64, sent: Option<u64>) -> InflightGuard {
        self.load.lock().start_request(worker, blocks);
        InflightGuard {
            tracker: self.clone(),
            worker,
            blocks,
            sent,
            started: Instant::now(),
            first: None,
            last: None,
            items: 0,
            on_end: None,
        }
    }

    /// Requests in flight on `worker`.
    pub fn get(&self, worker: u64) -> usize {
        self.load.lock().inflight(worker) as usize
    }
}

/// One request in flight; dropping it ends the count.
#[derive(Debug)]
pub struct InflightGuard {
    tracker: InflightTracker,
    worker: u64,
    blocks: u64,
    sent: Option<u64>,
    started: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    items: u32,
    on_end: Option<OnEnd>,
}

/// What runs when a guard is dropped, after the counts are released.
struct OnEnd(Box<dyn FnOnce() + Send + Sync>);

impl std::fmt::Debug for OnEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnEnd")
    }
}

impl InflightGuard {
    /// Also run `f` when the request ends (e.g. tell router replicas).
    pub fn on_end(mut self, f: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_end = Some(OnEnd(Box::new(f)));
        self
    }

    /// The worker the request went to.
    pub fn worker(&self) -> u64 {
        self.worker
    }

    /// An item of the response arrived now.
    fn observe_item(&mut self) {
        let now = Instant::now();
        if self.first.is_none() {
            self.first = Some(now);
            self.tracker.load.lock().record_ttft(self.worker, now - self.started);
        }
        self.last = Some(now);
        self.items += 1;
    }
}

impl Drop for InflightGuard {
    fn drop(&mut self) {
        let mut load = self.tracker.load.lock();
        load.finish_request(self.worker, self.blocks);
        if let (Some(first), Some(last), true) = (self.first, self.last, self.items >= 2) {
            load.record_tpot(self.worker, (last - first) / (self.items - 1));
        }
        if let Some(sent) = self.sent {
            load.forget_sent(self.worker, sent, self.blocks, Instant::now());
        }
        drop(load);
        if let Some(OnEnd(f)) = self.on_end.take() {
            f();
        }
    }
}

/// A stream that holds an [`InflightGuard`] until it ends or is dropped, timing its items.
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
        match &polled {
            Poll::Ready(None) => self.guard = None,
            Poll::Ready(Some(_)) => {
                if let Some(guard) = self.guard.as_mut() {
                    guard.observe_item();
                }
            }
            Poll::Pending => {}
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
        let timing = tracker.load().lock().timing(7).expect("items were timed");
        assert_eq!(timing.samples, 1, "one stream of two items (the other had none)");
    }
}

//! Requests in flight per worker, as the router counts them: an [`InflightGuard`] is
//! taken when a request is sent and ended when its response stream ends (the KV
//! selector's `on_end`, [`crate::routing::Selector::on_end`]; its drop, failing that),
//! reporting the stream's timing (its first item, and its mean time per item after the
//! first) to the [`LoadTracker`] for the straggler penalty.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::scheduler::LoadTracker;
use super::ttft::Waiting;

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
            prefill: None,
            ended: false,
        }
    }

    /// Requests in flight on `worker`.
    pub fn get(&self, worker: u64) -> usize {
        self.load.lock().inflight(worker) as usize
    }
}

/// One request in flight, until [`Self::end_at`] (or its drop) ends the count.
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
    /// Its prefill while it waits for its first item.
    prefill: Option<Waiting>,
    /// Released already ([`Self::end_at`]).
    ended: bool,
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

    /// Count `units` of prefill work waiting on the worker until the first item (or
    /// the end): the router's TTFT estimate ([`super::ttft`]).
    pub fn prefilling(mut self, units: u64) -> Self {
        self.prefill = Some(self.tracker.load.lock().prefill_sent(self.worker, units, self.sent.is_some(), self.started));
        self
    }

    /// The worker the request went to.
    pub fn worker(&self) -> u64 {
        self.worker
    }

    /// The request was sent at `at` rather than when the guard was taken (a replay's
    /// virtual clock): its prefill counts as sent then, estimated on that clock.
    pub fn started_at(mut self, at: Instant) -> Self {
        if let Some(waiting) = self.prefill.take() {
            let mut load = self.tracker.load.lock();
            load.prefill_abandoned(self.worker, waiting.units, self.started);
            self.prefill = Some(load.prefill_sent(self.worker, waiting.units, self.sent.is_some(), at));
        }
        self.started = at;
        self
    }

    /// An item of the response arrived now.
    pub fn observe_item(&mut self) {
        self.observe_item_at(Instant::now());
    }

    /// An item of the response arrived at `now`.
    pub fn observe_item_at(&mut self, now: Instant) {
        if self.first.is_none() {
            self.first = Some(now);
            let mut load = self.tracker.load.lock();
            load.record_ttft(self.worker, now - self.started);
            if let Some(waiting) = self.prefill.take() {
                load.prefill_first_item(self.worker, waiting, self.started, now - self.started);
            }
        }
        self.last = Some(now);
        self.items += 1;
    }

    /// The request ended at `now`: its counts are released, its sent blocks forgotten,
    /// its timing recorded, and its `on_end` run.
    pub fn end_at(mut self, now: Instant) {
        self.release(now);
    }

    fn release(&mut self, now: Instant) {
        if self.ended {
            return;
        }
        self.ended = true;
        let mut load = self.tracker.load.lock();
        load.finish_request(self.worker, self.blocks);
        if let Some(waiting) = self.prefill.take() {
            load.prefill_abandoned(self.worker, waiting.units, self.started);
        }
        if let (Some(first), Some(last), true) = (self.first, self.last, self.items >= 2) {
            load.record_tpot(self.worker, (last - first) / (self.items - 1));
            load.record_decode(self.worker, last - first);
        }
        if let Some(sent) = self.sent {
            load.forget_sent(self.worker, sent, self.blocks, now);
        }
        drop(load);
        if let Some(OnEnd(f)) = self.on_end.take() {
            f();
        }
    }
}

impl Drop for InflightGuard {
    /// A guard nobody ended (a request abandoned without its selector's `on_end`)
    /// ends now.
    fn drop(&mut self) {
        self.release(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn an_ended_guard_releases_once_and_times_its_items() {
        let tracker = InflightTracker::default();
        let mut guard = tracker.start(7);
        guard.observe_item();
        guard.observe_item();
        assert_eq!(tracker.get(7), 1);
        guard.end_at(Instant::now());
        assert_eq!(tracker.get(7), 0, "ended: released, and not again at its drop");
        let timing = tracker.load().lock().timing(7).expect("items were timed");
        assert_eq!(timing.samples, 1, "one stream of two items");
    }

    #[test]
    fn prefill_waits_until_the_first_item_or_the_end() {
        let tracker = InflightTracker::default();
        let mut first = tracker.start(3).prefilling(100);
        let second = tracker.start(3).prefilling(50);
        let estimate = |now| tracker.load().lock().ttft_estimate(3, 10, now);
        let now = Instant::now();
        assert_eq!(estimate(now), None, "nothing timed yet");
        first.observe_item();
        // 60 units waiting (50 + its own 10), and the second has waited since it was sent.
        let after_first = estimate(now).expect("timed");
        drop(second);
        let after_second = estimate(now).unwrap();
        assert!(after_second <= after_first, "{after_second:?} <= {after_first:?}");
        first.observe_item();
        first.end_at(Instant::now());
        assert_eq!(estimate(now), Some(after_second), "released once");
    }
}

//! The router's estimate of a request's time to first token (TTFT) on a worker, from its
//! own view: the prefill work it sent the worker that has no first item yet, how fast
//! the worker got through such work so far, and how long the request would wait for KV
//! cache room there.
//!
//! Work is counted in *prefill units*: the prompt tokens the worker must compute (those
//! not predicted in its prefix cache) when the router knows the tokens (KV routing), or
//! one unit per request when it does not (round-robin and random over OpenAI-level
//! requests: requests waiting × the TTFT per waiting request). A request sent with `ahead`
//! units already waiting on its worker, and `own` units of its own, that gets its first
//! item after `t`, of which `room` was its estimated wait for KV room (below), is a sample
//! of `(t - room) / (ahead + own)` seconds per unit; the worker's rate is a moving average
//! of those samples.
//!
//! Prefill work is not what sets TTFT once a worker's KV cache is full: a request then
//! waits in the worker's queue until running requests end and free the blocks it needs,
//! however little of its prompt is left to compute (a prompt whose prefix is cached but
//! not held by a running request needs its blocks back all the same). The wait for room
//! ([`kv_room_wait`]) is the worker's KV demand (the blocks in use per its load report,
//! less those of requests ended since, and the blocks of the requests queued there and
//! sent since, and of this one, each as many as a running request holds) beyond its KV
//! blocks, over the rate at which it frees blocks: blocks in use are held for about a
//! request's decode time (its first item to its last, as observed), so they free at
//! `in use / decode time` per second (Little's law). Its inputs are the load report's
//! fields (blocks in use and in all, requests running and waiting), which vLLM's workers
//! publish as the mocker does.
//!
//! The estimate for a new request is the larger of the two (`(waiting units + its own) ×
//! rate`, and the wait for room), and at least how long the oldest request waiting there
//! has waited already: the rate and the decode time are learnt from streams that come
//! back late (a TTFT, a whole stream), and a load report is a moment old, so under a
//! sudden surge the waits trail the queue, while the oldest waiting request shows at once
//! that the worker's queue is past a target. That gives the typical TTFT, while a
//! target is met or missed by the slow ones: the estimate is scaled by a high quantile
//! ([`SPREAD_QUANTILE`]) of the worker's recent ratios of a request's actual TTFT to the
//! one estimated when it was sent. It is approximate: the prefill units count only this
//! router's requests (the load report counts every frontend's), and the rate folds in
//! whatever else slows the worker's prefill as it was when the samples were taken.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Weight of a new sample in the moving average of the seconds per prefill unit.
const RATE_ALPHA: f64 = 0.2;
/// Recent ratios of actual to estimated TTFT kept per worker.
const SPREAD_WINDOW: usize = 128;
/// Ratios needed before they scale the estimate.
const SPREAD_MIN_SAMPLES: usize = 8;
/// The quantile of the ratios that scales the estimate: a target is about the slow
/// requests (a p99), not the typical one.
pub const SPREAD_QUANTILE: f64 = 0.99;

/// A request waiting for its first item on a worker, as [`PrefillQueue::sent`] counted it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Waiting {
    /// Its prefill units.
    pub units: u64,
    /// Units waiting ahead of it when it was sent.
    pub ahead: u64,
    /// Its TTFT as estimated then, before the spread (`None` before the rate was known).
    pub estimated: Option<Duration>,
    /// Its wait for KV room as estimated then, when known.
    pub room: Option<Duration>,
}

/// One worker's prefill queue as the router sees it, and its observed rate.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PrefillQueue {
    /// Units of the requests sent to it that have no first item yet.
    waiting_units: u64,
    /// When each of those requests was sent (a multiset).
    waiting_since: BTreeMap<Instant, u32>,
    /// Moving average of seconds per unit; `None` before the first sample.
    seconds_per_unit: Option<f64>,
    /// Recent ratios of actual to estimated TTFT, and their [`SPREAD_QUANTILE`].
    ratios: std::collections::VecDeque<f64>,
    spread: Option<f64>,
    /// Samples taken.
    samples: u64,
}

impl PrefillQueue {
    /// A request of `units` was sent at `at`, to wait `room` for KV room there (as
    /// [`kv_room_wait`] estimated it, when known): how it waits (the units ahead of it).
    pub(crate) fn sent(&mut self, units: u64, room: Option<Duration>, at: Instant) -> Waiting {
        let ahead = self.waiting_units;
        let estimated = self.unscaled(units, room);
        self.waiting_units = self.waiting_units.saturating_add(units);
        *self.waiting_since.entry(at).or_default() += 1;
        Waiting { units, ahead, estimated, room }
    }

    /// The TTFT of a request of `units` sent now as the rate alone estimates it.
    fn by_rate(&self, units: u64) -> Option<Duration> {
        let rate = self.seconds_per_unit?;
        let seconds = rate * self.waiting_units.saturating_add(units.max(1)) as f64;
        Some(Duration::from_secs_f64(seconds.clamp(0.0, 1e9)))
    }

    /// The TTFT of a request of `units` sent now that waits `room` for KV room, before the
    /// spread: the larger of the two waits.
    fn unscaled(&self, units: u64, room: Option<Duration>) -> Option<Duration> {
        let by_rate = self.by_rate(units)?;
        Some(room.map_or(by_rate, |room| by_rate.max(room)))
    }

    /// Drop one request sent at `at` from the waiting ones; whether there was one.
    fn forget(&mut self, at: Instant) -> bool {
        match self.waiting_since.get_mut(&at) {
            Some(1) => self.waiting_since.remove(&at).is_some(),
            Some(n) => {
                *n -= 1;
                true
            }
            None => false,
        }
    }

    /// The request `waiting` sent at `at` got its first item after `elapsed`: it no
    /// longer waits, and its time (less its estimated wait for room) is a sample of the
    /// rate, and its time a sample of the spread.
    pub(crate) fn first_item(&mut self, waiting: Waiting, at: Instant, elapsed: Duration) {
        let Waiting { units, ahead, estimated, room } = waiting;
        self.waiting_units = self.waiting_units.saturating_sub(units);
        self.forget(at);
        if let Some(estimated) = estimated.filter(|e| !e.is_zero()) {
            if self.ratios.len() == SPREAD_WINDOW {
                self.ratios.pop_front();
            }
            self.ratios.push_back(elapsed.as_secs_f64() / estimated.as_secs_f64());
            if self.ratios.len() >= SPREAD_MIN_SAMPLES {
                let mut sorted: Vec<f64> = self.ratios.iter().copied().collect();
                let at = ((sorted.len() - 1) as f64 * SPREAD_QUANTILE).round() as usize;
                sorted.select_nth_unstable_by(at, f64::total_cmp);
                self.spread = Some(sorted[at]);
            }
        }
        let prefill = elapsed.saturating_sub(room.unwrap_or(Duration::ZERO));
        let sample = prefill.as_secs_f64() / (ahead + units).max(1) as f64;
        self.seconds_per_unit = Some(match self.seconds_per_unit {
            None => sample,
            Some(rate) => rate + RATE_ALPHA * (sample - rate),
        });
        self.samples += 1;
    }

    /// The request of `units` sent at `at` ended without a first item (failed,
    /// cancelled): it no longer waits, and says nothing about the rate.
    pub(crate) fn abandoned(&mut self, units: u64, at: Instant) {
        self.waiting_units = self.waiting_units.saturating_sub(units);
        self.forget(at);
    }

    /// The estimated TTFT of a request of `units` sent at `now` that waits `room` for KV
    /// room (when known); `None` until a first item was timed.
    pub(crate) fn estimate(&self, units: u64, room: Option<Duration>, now: Instant) -> Option<Duration> {
        let queued = self.unscaled(units, room)?.mul_f64(self.spread.unwrap_or(1.0).clamp(0.0, 1e3));
        let oldest = self.waiting_since.keys().next().map_or(Duration::ZERO, |&since| now.saturating_duration_since(since));
        Some(queued.max(oldest))
    }

    /// Units waiting now.
    #[cfg(test)]
    fn waiting_units(&self) -> u64 {
        self.waiting_units
    }
}

/// How long a request waits for KV cache room on a worker of `total_blocks` whose
/// predicted demand, the request's own blocks included, is `demand_blocks`, while
/// `active_blocks` are in use and a request holds its blocks for `decode` (its first
/// item to its end): the demand beyond the cache, at the rate the blocks in use free
/// (`active_blocks / decode` per second; at least one block in use).
pub fn kv_room_wait(demand_blocks: f64, total_blocks: u64, active_blocks: u64, decode: Duration) -> Duration {
    let excess = demand_blocks - total_blocks as f64;
    if excess.is_nan() || excess <= 0.0 {
        return Duration::ZERO;
    }
    let seconds = excess * decode.as_secs_f64() / active_blocks.max(1) as f64;
    Duration::from_secs_f64(seconds.clamp(0.0, 1e9))
}

/// How to combine the workers' estimates into the router's estimate for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Aggregate {
    /// The lowest: the router sends the request where it is cheapest (KV routing).
    Best,
    /// The mean: a load-blind policy (round-robin, random) sends it anywhere.
    Mean,
}

/// The router's estimate from each candidate's own: `None` when any is unknown (a
/// worker not timed yet may well be idle, so nothing can be said to exceed a target).
pub fn combine(estimates: impl IntoIterator<Item = Option<Duration>>, how: Aggregate) -> Option<Duration> {
    let all: Option<Vec<Duration>> = estimates.into_iter().collect();
    let all = all.filter(|a| !a.is_empty())?;
    match how {
        Aggregate::Best => all.into_iter().min(),
        Aggregate::Mean => Some(all.iter().sum::<Duration>() / u32::try_from(all.len()).unwrap_or(u32::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn t0() -> Instant {
        Instant::now()
    }

    #[test]
    fn no_estimate_before_a_first_item_is_timed() {
        let mut q = PrefillQueue::default();
        let now = t0();
        q.sent(100, None, now);
        assert_eq!(q.estimate(50, None, now), None);
    }

    #[test]
    fn the_estimate_grows_with_the_work_waiting_ahead() {
        let mut q = PrefillQueue::default();
        let now = t0();
        let first = q.sent(100, None, now);
        assert_eq!((first.ahead, first.estimated), (0, None));
        // 100 units in 100 ms: 1 ms per unit.
        q.first_item(first, now, 100 * MS);
        assert_eq!(q.waiting_units(), 0);
        assert_eq!(q.estimate(50, None, now), Some(50 * MS));
        let a = q.sent(200, None, now);
        let b = q.sent(300, None, now);
        assert_eq!((a.ahead, b.ahead), (0, 200));
        assert_eq!(b.estimated, Some(500 * MS), "200 ahead and its own 300");
        // 500 units waiting, 50 of its own.
        assert_eq!(q.estimate(50, None, now), Some(550 * MS));
        // The second waited behind the first: 500 units in 1 s is 2 ms per unit, and the
        // average moves a fifth of the way there.
        q.first_item(b, now, 1000 * MS);
        assert_eq!(q.waiting_units(), 200);
        let rate = q.estimate(800, None, now).unwrap().as_secs_f64() / 1000.0;
        assert!((rate - 1.2e-3).abs() < 1e-9, "{rate}");
        q.abandoned(200, now);
        assert_eq!(q.waiting_units(), 0);
        q.abandoned(5, now);
        assert_eq!(q.waiting_units(), 0, "never below zero");
    }

    #[test]
    fn a_request_of_no_known_work_counts_as_one_unit() {
        let mut q = PrefillQueue::default();
        let now = t0();
        let w = q.sent(0, None, now);
        q.first_item(w, now, 30 * MS);
        assert_eq!(q.estimate(0, None, now), Some(30 * MS));
    }

    #[test]
    fn a_request_waiting_long_already_raises_the_estimate_at_once() {
        let mut q = PrefillQueue::default();
        let start = t0();
        let w = q.sent(10, None, start);
        q.first_item(w, start, 10 * MS);
        // A surge: the rate (1 ms per unit) says 21 ms, but the oldest request waiting
        // has waited 900 ms already.
        let oldest = q.sent(10, None, start);
        q.sent(10, None, start + 500 * MS);
        assert_eq!(oldest.ahead, 0);
        assert_eq!(q.estimate(1, None, start + 900 * MS), Some(900 * MS));
        // Its first item (timed at 10 ms: the rate stays 1 ms per unit).
        q.first_item(Waiting { estimated: None, ..oldest }, start, 10 * MS);
        let later = start + 1000 * MS;
        assert_eq!(q.estimate(1, None, later), Some(500 * MS), "the next oldest, sent at 500 ms");
        // Retimed to a replay's clock (taken back and sent again), it counts from there.
        q.abandoned(10, start + 500 * MS);
        q.sent(10, None, start + 800 * MS);
        assert_eq!(q.estimate(1, None, later), Some(200 * MS));
        q.abandoned(10, start + 800 * MS);
        assert!(q.estimate(1, None, later).unwrap() < 200 * MS, "nothing waits: the rate alone");
    }

    #[test]
    fn the_estimate_is_scaled_by_the_slow_requests_once_there_are_enough() {
        let mut q = PrefillQueue::default();
        let now = t0();
        let w = q.sent(10, None, now);
        q.first_item(w, now, 10 * MS);
        assert_eq!(q.estimate(10, None, now), Some(10 * MS), "no spread yet");
        // Requests estimated at 10 ms: one in ten takes three times that.
        for i in 0..40 {
            let w = Waiting { units: 1, ahead: 0, estimated: Some(10 * MS), room: None };
            q.first_item(w, now, if i % 10 == 0 { 30 * MS } else { 10 * MS });
            if i + 1 == SPREAD_MIN_SAMPLES - 1 {
                assert_eq!(q.spread, None, "not enough ratios yet");
            }
        }
        assert_eq!(q.spread, Some(3.0), "the 99th percentile of the ratios");
        assert_eq!(q.estimate(10, None, now), q.by_rate(10).map(|d| d.mul_f64(3.0)));
    }

    #[test]
    fn the_wait_for_kv_room_is_the_demand_beyond_the_cache_at_the_freeing_rate() {
        let decode = 1000 * MS;
        // Room left: no wait, however long the prefill queue.
        assert_eq!(kv_room_wait(200.0, 256, 180, decode), Duration::ZERO);
        assert_eq!(kv_room_wait(256.0, 256, 240, decode), Duration::ZERO);
        // 240 blocks in use, each held for 1 s: 240 free per second. 64 blocks beyond the
        // cache (e.g. four queued requests of 16 blocks) wait 64 / 240 s.
        let wait = kv_room_wait(320.0, 256, 240, decode);
        assert!((wait.as_secs_f64() - 64.0 / 240.0).abs() < 1e-9, "{wait:?}");
        // Twice the queue, twice the wait; twice the decode time, twice the wait.
        let twice = 2.0 * 64.0 / 240.0;
        assert!((kv_room_wait(384.0, 256, 240, decode).as_secs_f64() - twice).abs() < 1e-9);
        assert!((kv_room_wait(320.0, 256, 240, decode * 2).as_secs_f64() - twice).abs() < 1e-9);
        // Nothing in use yet counts as one block, not a division by zero.
        assert_eq!(kv_room_wait(257.0, 256, 0, decode), decode);
    }

    #[test]
    fn the_estimate_is_the_larger_of_the_prefill_queue_and_the_wait_for_room() {
        let mut q = PrefillQueue::default();
        let now = t0();
        assert_eq!(q.estimate(10, Some(500 * MS), now), None, "no estimate before a first item is timed");
        let w = q.sent(10, None, now);
        q.first_item(w, now, 10 * MS);
        // 1 ms per unit: 10 units are 10 ms, unless the request waits longer for room.
        assert_eq!(q.estimate(10, None, now), Some(10 * MS));
        assert_eq!(q.estimate(10, Some(Duration::ZERO), now), Some(10 * MS));
        assert_eq!(q.estimate(10, Some(400 * MS), now), Some(400 * MS));
        // A request sent to wait for room was estimated at that wait; its actual TTFT is
        // compared with it, and only its time beyond that wait is prefill: 10 ms more for
        // its 10 units keeps the rate at 1 ms per unit.
        for _ in 0..SPREAD_MIN_SAMPLES {
            let w = q.sent(10, Some(400 * MS), now);
            assert_eq!((w.estimated, w.room), (Some(400 * MS), Some(400 * MS)));
            q.first_item(w, now, 410 * MS);
        }
        assert!((q.spread.unwrap() - 410.0 / 400.0).abs() < 1e-9, "{:?}", q.spread);
        assert_eq!(q.by_rate(10), Some(10 * MS));
    }

    #[test]
    fn the_router_takes_the_best_or_the_mean_and_nothing_when_one_is_unknown() {
        let known = [Some(10 * MS), Some(30 * MS)];
        assert_eq!(combine(known, Aggregate::Best), Some(10 * MS));
        assert_eq!(combine(known, Aggregate::Mean), Some(20 * MS));
        assert_eq!(combine([Some(10 * MS), None], Aggregate::Best), None);
        assert_eq!(combine([], Aggregate::Best), None);
    }
}

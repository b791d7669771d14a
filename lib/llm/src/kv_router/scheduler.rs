//! The router's view of each worker's load, and the choice of a worker from it.
//!
//! A worker's decode load is, when it publishes load metrics (`load_metrics`, as the
//! mocker does), the KV blocks its last metrics report in use, plus the blocks its
//! queued requests will want (a worker whose cache is full reports about the same blocks
//! in use whatever its queue): each as many as the moving average of the new blocks of
//! the requests routed there, or before any, as its running requests hold on average;
//! plus the blocks of the requests this router (or a replica sharing its decisions) sent
//! it since — kept until metrics received [`METRICS_LAG`] after the send must include
//! them, or until the request's stream ends; and minus the blocks of requests that ended
//! since metrics that still counted them (until metrics received [`METRICS_LAG`] after
//! the end). Without metrics (or when they are older than [`METRICS_STALE`]), it is the
//! blocks of the requests the router has in flight there.
//!
//! Streams routed through the router report their timing (the first item, and when they
//! end their mean time per item after it); a worker whose time per item (its fastest
//! latest stream's: every one of its latest streams that slow) is
//! [`SchedulerConfig::straggler_threshold`] times the fleet's (the lower median of the
//! same over the workers with enough streams timed) or more,
//! and at least [`STRAGGLER_MIN_EXCESS`] more, is a straggler: its cached prefix does not
//! count and its cost is multiplied by that ratio (see [`super::selector`]).
//!
//! With a busy threshold, a worker whose predicted KV demand (that decode load, as a
//! fraction of its KV blocks; a queue can take it over 1) is at or above it is busy;
//! when every candidate is busy the router refuses ([`ScheduleError::AllBusy`]; the
//! frontend answers 503 with `Retry-After`) instead of queueing more.
//!
//! Methods take the current time, so tests and the routing lab drive the clock.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rand::Rng;

use super::selector::{select, Candidate, SelectorWeights};
use super::protocols::ForwardPassMetrics;
use super::ttft::{kv_room_wait, PrefillQueue, Waiting};

/// Sent blocks stay counted until metrics received this long after the send.
pub const METRICS_LAG: Duration = Duration::from_millis(250);
/// Metrics older than this are ignored (the worker stopped publishing).
pub const METRICS_STALE: Duration = Duration::from_secs(5);
/// Default ratio to the fleet's time per item from which a worker is a straggler.
pub const DEFAULT_STRAGGLER_THRESHOLD: f64 = 2.0;
/// Streams of a worker timed before it is compared with the fleet.
pub const STRAGGLER_MIN_SAMPLES: u64 = 8;
/// A straggler's time per item also exceeds the fleet's by this much: differences of
/// fractions of a millisecond are network jitter, not a slow engine.
pub const STRAGGLER_MIN_EXCESS: Duration = Duration::from_millis(2);
/// Weight of a new sample in the moving averages of the time to the first item and of
/// the new blocks of requests sent.
const EWMA_ALPHA: f64 = 0.1;
/// Streams whose median time per item is a worker's.
const TPOT_WINDOW: usize = 32;
/// Cap on the cost multiplier of a straggler.
const MAX_SLOWNESS: f64 = 100.0;

/// Why no worker was chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// No live worker.
    #[error("no worker instances")]
    NoWorkers,
    /// Every worker is at or above the busy threshold.
    #[error("all {workers} workers are busy (KV cache usage at or above {threshold}); retry later")]
    AllBusy {
        /// Workers considered.
        workers: usize,
        /// The busy threshold.
        threshold: String,
    },
}

/// Settings of the scheduler.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SchedulerConfig {
    /// The cost function's weight and the temperature.
    pub weights: SelectorWeights,
    /// Fraction of its KV blocks in use (0–1] at which a worker is busy; `None`: never.
    pub busy_threshold: Option<f64>,
    /// With a busy threshold: how long a request that finds every worker busy waits at
    /// the frontend, first come first served, for one to fall under the threshold (or a
    /// new one to join) before it is refused; `None`: refused at once.
    pub busy_wait: Option<Duration>,
    /// Ratio to the fleet's time per item from which a worker is penalised (≥ 1;
    /// infinity turns the penalty off).
    pub straggler_threshold: f64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            weights: SelectorWeights::default(),
            busy_threshold: None,
            busy_wait: None,
            straggler_threshold: DEFAULT_STRAGGLER_THRESHOLD,
        }
    }
}

impl SchedulerConfig {
    /// Check the ranges.
    pub fn validate(&self) -> Result<(), String> {
        self.weights.validate()?;
        if let Some(t) = self.busy_threshold {
            if !(t > 0.0 && t <= 1.0) {
                return Err(format!("busy threshold must be in (0, 1], got {t}"));
            }
        }
        if self.busy_wait.is_some() && self.busy_threshold.is_none() {
            return Err("a busy wait applies with a busy threshold".to_string());
        }
        if self.straggler_threshold.is_nan() || self.straggler_threshold < 1.0 {
            return Err(format!("straggler threshold must be >= 1, got {}", self.straggler_threshold));
        }
        Ok(())
    }
}

/// A worker's load as its metrics last said.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reported {
    active_blocks: u64,
    total_blocks: u64,
    running: u64,
    waiting: u64,
    received: Instant,
}

impl Reported {
    /// KV blocks the queued requests will want: each as many as `per_request`, or without
    /// it as many as a running request holds on average; at least one.
    fn queued_blocks(&self, per_request: Option<f64>) -> f64 {
        if self.waiting == 0 {
            return 0.0;
        }
        self.waiting as f64 * self.request_blocks(per_request)
    }

    /// KV blocks a request will want: `per_request`, or without it as many as a running
    /// request holds on average; at least one.
    fn request_blocks(&self, per_request: Option<f64>) -> f64 {
        let per_request = per_request.unwrap_or_else(|| match self.running {
            0 => 1.0,
            running => self.active_blocks as f64 / running as f64,
        });
        per_request.max(1.0)
    }
}

/// An exponentially weighted moving average with a sample count.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Ewma {
    value: f64,
    samples: u64,
}

impl Ewma {
    fn add(&mut self, x: f64) {
        self.value = if self.samples == 0 { x } else { self.value + EWMA_ALPHA * (x - self.value) };
        self.samples += 1;
    }
}

/// The median and the least of the latest [`TPOT_WINDOW`] samples, with the count of all
/// samples.
///
/// A worker's time per item is judged by each stream's mean time per item after the
/// first, not by the gaps between items: one engine step gives every running sequence
/// the same gap, so at high concurrency a window of gaps spans a single step, and a step
/// that carries a long prefill chunk would make a healthy worker look several times
/// slower. A stream's mean spans its whole decode. A straggler is judged by the fastest
/// of its latest streams: a slow engine makes every stream slow, while a healthy worker
/// has slow streams only while its own load slows them (decoding beside a long prompt's
/// prefill, preempted when its cache was full) and fast ones in between. The median is
/// what [`WorkerTiming`] reports.
#[derive(Debug, Clone, Default, PartialEq)]
struct RecentMedian {
    window: VecDeque<f64>,
    median: f64,
    /// The least of the same streams.
    least: f64,
    samples: u64,
}

impl RecentMedian {
    fn add(&mut self, x: f64) {
        if self.window.len() == TPOT_WINDOW {
            self.window.pop_front();
        }
        self.window.push_back(x);
        self.samples += 1;
        let mut sorted: Vec<f64> = self.window.iter().copied().collect();
        sorted.sort_by(f64::total_cmp);
        self.median = sorted[(sorted.len() - 1) / 2];
        self.least = sorted[0];
    }
}

/// A request sent and not yet in the worker's metrics.
#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    sent: Instant,
    blocks: u64,
    /// Sent by another router replica (not in this router's in-flight counts).
    peer: bool,
}

#[derive(Debug, Default)]
struct WorkerLoad {
    reported: Option<Reported>,
    /// Requests sent since the metrics that include them.
    pending: VecDeque<Pending>,
    /// (time ended, blocks) of requests that ended since the metrics that include them.
    released: VecDeque<(Instant, u64)>,
    inflight_requests: u64,
    inflight_blocks: u64,
    /// Moving average of the new blocks of the requests sent to it (by any replica).
    new_blocks: Ewma,
    /// Seconds per streamed item after the first, of each stream.
    tpot: RecentMedian,
    /// Seconds to the first item.
    ttft: Ewma,
    /// Seconds from a stream's first item to its last: how long a request holds its KV
    /// blocks, about.
    decode: Ewma,
    /// Prefill work sent and not started, and the observed rate (see [`super::ttft`]).
    prefill: PrefillQueue,
}

impl WorkerLoad {
    fn fresh(&self, now: Instant) -> Option<&Reported> {
        self.reported.as_ref().filter(|r| now.saturating_duration_since(r.received) <= METRICS_STALE)
    }

    fn decode_blocks(&self, now: Instant) -> f64 {
        match self.fresh(now) {
            Some(r) => {
                let sent: u64 = self.pending.iter().map(|p| p.blocks).sum();
                let ended: u64 = self.released.iter().map(|(_, b)| b).sum();
                let per_request = (self.new_blocks.samples > 0).then_some(self.new_blocks.value);
                ((r.active_blocks + sent) as f64 + r.queued_blocks(per_request) - ended as f64).max(0.0)
            }
            None => {
                let peers: u64 = self.pending.iter().filter(|p| p.peer).map(|p| p.blocks).sum();
                (self.inflight_blocks + peers) as f64
            }
        }
    }

    /// How long a request would wait for KV room on it at `now` ([`kv_room_wait`]),
    /// behind the requests queued there per its metrics and those sent since, and `own`
    /// more (1 for a request not sent yet); `None` without fresh metrics or before a
    /// stream's decode was timed.
    ///
    /// Each waiting request is counted as wanting the blocks a running request holds on
    /// average, not the blocks the router predicts it adds: a prefix cached but held by no
    /// running request takes its blocks back from the free ones all the same, and blocks
    /// shared by running requests are counted once in the blocks in use.
    fn room_wait(&self, own: u64, now: Instant) -> Option<Duration> {
        let r = self.fresh(now).filter(|r| r.total_blocks > 0)?;
        let decode = (self.decode.samples > 0).then(|| Duration::from_secs_f64(self.decode.value))?;
        let queued = r.waiting + self.pending.len() as u64 + own;
        let ended: u64 = self.released.iter().map(|(_, b)| b).sum();
        let demand = r.active_blocks as f64 - ended as f64 + queued as f64 * r.request_blocks(None);
        Some(kv_room_wait(demand, r.total_blocks, r.active_blocks, decode))
    }
}

/// KV blocks a request of `request_blocks` full blocks adds on a worker predicted to
/// hold `overlap_blocks` of them: cached prefix blocks are shared, not added per request;
/// the partial block and what it decodes into count as one.
pub(crate) fn new_blocks(request_blocks: usize, overlap_blocks: usize) -> u64 {
    request_blocks.saturating_sub(overlap_blocks) as u64 + 1
}

/// The worker [`LoadTracker::schedule`] chose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    /// Its instance id.
    pub worker: u64,
    /// Leading request blocks it was predicted to hold.
    pub overlap_blocks: usize,
    /// The id of the request's blocks counted on it ([`LoadTracker::forget_sent`]).
    pub sent: u64,
}

/// What a worker's timing looks like to the router (for reports and tests).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WorkerTiming {
    /// Median over its latest streams of their seconds per item after the first.
    pub tpot_s: f64,
    /// Moving average of the seconds to the first item.
    pub ttft_s: f64,
    /// Streams timed.
    pub samples: u64,
}

/// Load and timing of every worker the router knows, and the choice among them.
#[derive(Debug, Default)]
pub struct LoadTracker {
    config: SchedulerConfig,
    workers: HashMap<u64, WorkerLoad>,
    next_sent: u64,
}

impl LoadTracker {
    /// No workers known yet.
    pub fn new(config: SchedulerConfig) -> Self {
        LoadTracker { config, workers: HashMap::new(), next_sent: 0 }
    }

    /// Its settings.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// A worker's load metrics arrived at `now`.
    pub fn update_metrics(&mut self, worker: u64, metrics: &ForwardPassMetrics, now: Instant) {
        let load = self.workers.entry(worker).or_default();
        load.reported = Some(Reported {
            active_blocks: metrics.kv_active_blocks,
            total_blocks: metrics.kv_total_blocks,
            running: metrics.request_active_slots,
            waiting: metrics.num_requests_waiting,
            received: now,
        });
        while load.pending.front().is_some_and(|p| now.saturating_duration_since(p.sent) >= METRICS_LAG) {
            load.pending.pop_front();
        }
        while load.released.front().is_some_and(|(ended, _)| now.saturating_duration_since(*ended) >= METRICS_LAG) {
            load.released.pop_front();
        }
    }

    /// A request of `blocks` KV blocks was sent to `worker` at `now` (by this router or
    /// a replica): counted until metrics include it or [`Self::forget_sent`]. Returns
    /// its id for the latter.
    pub fn record_sent(&mut self, worker: u64, blocks: u64, now: Instant) -> u64 {
        self.push_sent(worker, blocks, now, false)
    }

    /// [`Self::record_sent`] for a request another router replica sent: without fresh
    /// metrics it also counts in the worker's load until [`Self::forget_sent`].
    pub fn record_peer_sent(&mut self, worker: u64, blocks: u64, now: Instant) -> u64 {
        self.push_sent(worker, blocks, now, true)
    }

    fn push_sent(&mut self, worker: u64, blocks: u64, now: Instant, peer: bool) -> u64 {
        self.next_sent += 1;
        let id = self.next_sent;
        let load = self.workers.entry(worker).or_default();
        load.pending.push_back(Pending { id, sent: now, blocks, peer });
        load.new_blocks.add(blocks as f64);
        id
    }

    /// The request `id` of [`Self::record_sent`] (of `blocks` blocks) on `worker` ended
    /// at `now`: it is dropped from those sent, and its blocks are taken off the metrics
    /// received until [`METRICS_LAG`] after `now` (which may have been taken while it
    /// ran; the estimate is clamped at 0).
    pub fn forget_sent(&mut self, worker: u64, id: u64, blocks: u64, now: Instant) {
        if let Some(load) = self.workers.get_mut(&worker) {
            load.pending.retain(|p| p.id != id);
            // Metrics taken while it ran may still arrive (or have arrived) and count it:
            // also the worker's first metrics, when the request ended before any came.
            while load.released.front().is_some_and(|(ended, _)| now.saturating_duration_since(*ended) >= METRICS_LAG) {
                load.released.pop_front();
            }
            load.released.push_back((now, blocks));
        }
    }

    /// A request of `blocks` blocks is in flight on `worker` from this router.
    pub fn start_request(&mut self, worker: u64, blocks: u64) {
        let load = self.workers.entry(worker).or_default();
        load.inflight_requests += 1;
        load.inflight_blocks += blocks;
    }

    /// A request started with [`Self::start_request`] ended.
    pub fn finish_request(&mut self, worker: u64, blocks: u64) {
        if let Some(load) = self.workers.get_mut(&worker) {
            load.inflight_requests = load.inflight_requests.saturating_sub(1);
            load.inflight_blocks = load.inflight_blocks.saturating_sub(blocks);
        }
    }

    /// The first item of a stream from `worker` came `elapsed` after the request.
    pub fn record_ttft(&mut self, worker: u64, elapsed: Duration) {
        self.workers.entry(worker).or_default().ttft.add(elapsed.as_secs_f64());
    }

    /// A request of `units` prefill units was sent to `worker` at `at`: how it waits
    /// there (see [`super::ttft`]). `recorded`: it is counted among the requests sent
    /// already ([`Self::record_sent`]).
    pub fn prefill_sent(&mut self, worker: u64, units: u64, recorded: bool, at: Instant) -> Waiting {
        let load = self.workers.entry(worker).or_default();
        let room = load.room_wait(u64::from(!recorded), at);
        load.prefill.sent(units, room, at)
    }

    /// The request `waiting` sent to `worker` at `at` got its first item after `elapsed`.
    pub fn prefill_first_item(&mut self, worker: u64, waiting: Waiting, at: Instant, elapsed: Duration) {
        self.workers.entry(worker).or_default().prefill.first_item(waiting, at, elapsed);
    }

    /// The request of `units` sent to `worker` at `at` ended without a first item.
    pub fn prefill_abandoned(&mut self, worker: u64, units: u64, at: Instant) {
        if let Some(load) = self.workers.get_mut(&worker) {
            load.prefill.abandoned(units, at);
        }
    }

    /// The estimated time to first token on `worker` of a request of `units` prefill
    /// units sent at `now`; `None` before the worker's first item was timed.
    pub fn ttft_estimate(&self, worker: u64, units: u64, now: Instant) -> Option<Duration> {
        let load = self.workers.get(&worker)?;
        load.prefill.estimate(units, load.room_wait(1, now), now)
    }

    /// A stream from `worker` took `per_item` per item after its first (its last item's
    /// time less its first's, over the items after the first).
    pub fn record_tpot(&mut self, worker: u64, per_item: Duration) {
        self.workers.entry(worker).or_default().tpot.add(per_item.as_secs_f64());
    }

    /// A stream from `worker` had its last item `decode` after its first.
    pub fn record_decode(&mut self, worker: u64, decode: Duration) {
        self.workers.entry(worker).or_default().decode.add(decode.as_secs_f64());
    }

    /// Requests in flight on `worker` from this router.
    pub fn inflight(&self, worker: u64) -> u64 {
        self.workers.get(&worker).map_or(0, |l| l.inflight_requests)
    }

    /// Predicted KV blocks in use on `worker` at `now`, and wanted by its queue.
    pub fn decode_blocks(&self, worker: u64, now: Instant) -> f64 {
        self.workers.get(&worker).map_or(0.0, |l| l.decode_blocks(now))
    }

    /// Requests waiting on `worker` per its fresh metrics.
    pub fn waiting(&self, worker: u64, now: Instant) -> Option<u64> {
        self.workers.get(&worker).and_then(|l| l.fresh(now)).map(|r| r.waiting)
    }

    /// The timing observed for `worker`.
    pub fn timing(&self, worker: u64) -> Option<WorkerTiming> {
        let l = self.workers.get(&worker)?;
        (l.tpot.samples > 0 || l.ttft.samples > 0)
            .then_some(WorkerTiming { tpot_s: l.tpot.median, ttft_s: l.ttft.value, samples: l.tpot.samples })
    }

    /// The cost multiplier of each of `workers` (1 unless a straggler).
    pub fn slowness(&self, workers: &[u64]) -> Vec<f64> {
        let timed: Vec<(u64, f64)> = workers
            .iter()
            .filter_map(|w| self.workers.get(w).map(|l| (*w, &l.tpot)))
            .filter(|(_, tpot)| tpot.samples >= STRAGGLER_MIN_SAMPLES && tpot.least > 0.0)
            .map(|(w, tpot)| (w, tpot.least))
            .collect();
        if timed.len() < 2 || !self.config.straggler_threshold.is_finite() {
            return vec![1.0; workers.len()];
        }
        let mut values: Vec<f64> = timed.iter().map(|(_, v)| *v).collect();
        values.sort_by(f64::total_cmp);
        let fleet = values[(values.len() - 1) / 2];
        workers
            .iter()
            .map(|w| {
                let own = timed.iter().find(|(t, _)| t == w).map_or(fleet, |(_, v)| *v);
                let ratio = own / fleet;
                if ratio >= self.config.straggler_threshold && own - fleet >= STRAGGLER_MIN_EXCESS.as_secs_f64() {
                    ratio.min(MAX_SLOWNESS)
                } else {
                    1.0
                }
            })
            .collect()
    }

    /// Whether `worker`'s predicted KV demand is at or above the busy threshold (never
    /// without a threshold or fresh metrics).
    pub fn is_busy(&self, worker: u64, now: Instant) -> bool {
        let (Some(threshold), Some(load)) = (self.config.busy_threshold, self.workers.get(&worker)) else {
            return false;
        };
        match load.fresh(now) {
            Some(r) if r.total_blocks > 0 => load.decode_blocks(now) / r.total_blocks as f64 >= threshold,
            _ => false,
        }
    }

    /// Forget workers not in `live`.
    pub fn retain(&mut self, live: &[u64]) {
        self.workers.retain(|w, _| live.contains(w));
    }

    /// Forget `worker`.
    pub fn remove_worker(&mut self, worker: u64) {
        self.workers.remove(&worker);
    }

    /// The candidates for a request of `request_blocks` full blocks, given each
    /// worker's predicted overlap.
    pub fn candidates(&self, overlaps: &[(u64, usize)], now: Instant) -> Vec<Candidate> {
        let ids: Vec<u64> = overlaps.iter().map(|(w, _)| *w).collect();
        let slowness = self.slowness(&ids);
        overlaps
            .iter()
            .zip(slowness)
            .map(|(&(worker, overlap_blocks), slowness)| Candidate {
                worker,
                overlap_blocks,
                decode_blocks: self.decode_blocks(worker, now),
                slowness,
            })
            .collect()
    }

    /// Choose among the workers of `overlaps` (each with its predicted overlap) for a
    /// request of `request_blocks` full blocks, and count the request's blocks on it
    /// (see [`Self::record_sent`]). Busy workers are left out.
    pub fn schedule(
        &mut self,
        overlaps: &[(u64, usize)],
        request_blocks: usize,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Result<Choice, ScheduleError> {
        if overlaps.is_empty() {
            return Err(ScheduleError::NoWorkers);
        }
        let open: Vec<(u64, usize)> = overlaps.iter().copied().filter(|(w, _)| !self.is_busy(*w, now)).collect();
        if open.is_empty() {
            let threshold = self.config.busy_threshold.map_or_else(String::new, |t| t.to_string());
            return Err(ScheduleError::AllBusy { workers: overlaps.len(), threshold });
        }
        let candidates = self.candidates(&open, now);
        let chosen = select(&candidates, request_blocks, self.config.weights, rng).ok_or(ScheduleError::NoWorkers)?;
        tracing::debug!(
            worker = %format_args!("{:x}", chosen.worker),
            overlap = chosen.overlap_blocks,
            request_blocks,
            ?candidates,
            "kv routing decision"
        );
        let sent = self.record_sent(chosen.worker, new_blocks(request_blocks, chosen.overlap_blocks), now);
        Ok(Choice { worker: chosen.worker, overlap_blocks: chosen.overlap_blocks, sent })
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn metrics(active: u64, total: u64) -> ForwardPassMetrics {
        ForwardPassMetrics { kv_active_blocks: active, kv_total_blocks: total, ..Default::default() }
    }

    fn rng() -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(1)
    }

    #[test]
    fn temperature_zero_repeats_the_same_choice() {
        let t0 = Instant::now();
        let weights = SelectorWeights { overlap_weight: 1.0, temperature: 0.0 };
        let mut a = LoadTracker::new(SchedulerConfig { weights, ..Default::default() });
        let mut b = LoadTracker::new(SchedulerConfig { weights, ..Default::default() });
        for (w, active) in [(1, 40), (2, 10), (3, 25)] {
            a.update_metrics(w, &metrics(active, 100), t0);
            b.update_metrics(w, &metrics(active, 100), t0);
        }
        let overlaps = [(1, 4), (2, 0), (3, 2)];
        // Costs: 1: 0 + 40 + 4; 2: 4 + 10 + 4; 3: 2 + 25 + 4. Worker 2 takes it and its
        // load grows by the request's blocks each time, until it is no longer cheapest.
        let seq_a: Vec<u64> =
            (0..6).map(|_| a.schedule(&overlaps, 4, t0, &mut rand::rng()).unwrap().worker).collect();
        let seq_b: Vec<u64> = (0..6).map(|_| b.schedule(&overlaps, 4, t0, &mut rng()).unwrap().worker).collect();
        assert_eq!(seq_a, seq_b, "no randomness without ties");
        assert_eq!(&seq_a[..2], &[2, 2]);
        assert_eq!(a.decode_blocks(2, t0), 10.0 + 5.0 * seq_a.iter().filter(|w| **w == 2).count() as f64);
    }

    #[test]
    fn a_queue_counts_as_load_when_the_cache_is_full() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        let full = |running, waiting| ForwardPassMetrics {
            kv_active_blocks: 600,
            kv_total_blocks: 640,
            request_active_slots: running,
            num_requests_waiting: waiting,
            ..Default::default()
        };
        // Both caches are full; worker 1 has 30 requests queued behind its 20 running (30
        // blocks each on average), worker 2 has 2.
        tracker.update_metrics(1, &full(20, 30), t0);
        tracker.update_metrics(2, &full(20, 2), t0);
        assert_eq!(tracker.decode_blocks(1, t0), 600.0 + 30.0 * 30.0);
        assert_eq!(tracker.decode_blocks(2, t0), 600.0 + 2.0 * 30.0);
        // Worker 1 holds the request's 10 blocks, but the 28 extra queued requests (840
        // blocks) outweigh the 10 × 8 blocks of prefill they save.
        let weights = SelectorWeights { overlap_weight: 8.0, temperature: 0.0 };
        let mut tracker_w8 = LoadTracker::new(SchedulerConfig { weights, ..Default::default() });
        tracker_w8.update_metrics(1, &full(20, 30), t0);
        tracker_w8.update_metrics(2, &full(20, 2), t0);
        assert_eq!(tracker_w8.schedule(&[(1, 10), (2, 0)], 10, t0, &mut rng()).unwrap().worker, 2);
        // With equal queues the cached prefix wins.
        tracker_w8.update_metrics(1, &full(20, 2), t0);
        assert_eq!(tracker_w8.schedule(&[(1, 10), (2, 0)], 10, t0, &mut rng()).unwrap().worker, 1);
        // Nothing running: each queued request counts one block.
        tracker.update_metrics(1, &ForwardPassMetrics { num_requests_waiting: 3, ..full(0, 0) }, t0);
        assert_eq!(tracker.decode_blocks(1, t0), 603.0);
        // Once requests were routed to it, a queued one counts as many blocks as they
        // added on average (cached prefixes are shared, not wanted again).
        tracker.record_sent(1, 4, t0);
        tracker.record_sent(1, 4, t0);
        let later = t0 + METRICS_LAG;
        tracker.update_metrics(1, &full(20, 30), later);
        assert_eq!(tracker.decode_blocks(1, later), 600.0 + 30.0 * 4.0);
    }

    #[test]
    fn the_ttft_estimate_waits_for_kv_room_when_the_cache_is_full() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        // 16 requests running in 240 of 256 blocks (15 each), 4 queued.
        let full = ForwardPassMetrics {
            kv_active_blocks: 240,
            kv_total_blocks: 256,
            request_active_slots: 16,
            num_requests_waiting: 4,
            ..Default::default()
        };
        tracker.update_metrics(1, &full, t0);
        // Prefill timed at 1 ms per unit; the wait for room needs a decode timed first.
        let w = tracker.prefill_sent(1, 100, false, t0);
        assert_eq!(w.room, None);
        tracker.prefill_first_item(1, w, t0, Duration::from_millis(100));
        assert_eq!(tracker.ttft_estimate(1, 10, t0), Some(Duration::from_millis(10)));
        // Requests hold their blocks for 1 s: the 240 blocks in use free 240 per second.
        tracker.record_decode(1, Duration::from_secs(1));
        // 240 in use + (4 queued + itself) × 15: 59 beyond the cache, 59 / 240 s.
        let seconds = |d: Option<Duration>| d.unwrap().as_secs_f64();
        assert!((seconds(tracker.ttft_estimate(1, 10, t0)) - 59.0 / 240.0).abs() < 1e-9);
        // Each queued request counts a running request's blocks, whatever the router
        // predicted it adds (a cached prefix held by no running request needs room too).
        tracker.record_sent(1, 1, t0);
        assert!((seconds(tracker.ttft_estimate(1, 10, t0)) - 74.0 / 240.0).abs() < 1e-9, "one more queued");
        // Sent and recorded, it is estimated behind the 4 queued only.
        let sent = tracker.prefill_sent(1, 10, true, t0);
        assert!((seconds(sent.room) - 59.0 / 240.0).abs() < 1e-9, "{sent:?}");
        tracker.prefill_abandoned(1, 10, t0);
        // A request that ended since the metrics frees its blocks: 45 blocks, 3 requests.
        tracker.forget_sent(1, 999, 45, t0);
        assert!((seconds(tracker.ttft_estimate(1, 10, t0)) - 29.0 / 240.0).abs() < 1e-9);
        // Room again: the prefill queue alone.
        let room = ForwardPassMetrics { kv_active_blocks: 100, num_requests_waiting: 0, ..full };
        let later = t0 + METRICS_LAG;
        tracker.update_metrics(1, &room, later);
        assert_eq!(tracker.ttft_estimate(1, 10, later), Some(Duration::from_millis(10)));
        // Stale metrics say nothing about room.
        tracker.update_metrics(1, &full, later);
        let stale = later + METRICS_STALE + Duration::from_secs(1);
        assert_eq!(tracker.ttft_estimate(1, 10, stale), Some(Duration::from_millis(10)));
    }

    #[test]
    fn optimistic_accounting_spreads_a_burst_until_metrics_catch_up() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        for w in 1..=4 {
            tracker.update_metrics(w, &metrics(0, 1000), t0);
        }
        let overlaps: Vec<(u64, usize)> = (1..=4).map(|w| (w, 0)).collect();
        let mut per_worker = HashMap::new();
        for _ in 0..40 {
            let c = tracker.schedule(&overlaps, 10, t0, &mut rng()).unwrap();
            *per_worker.entry(c.worker).or_insert(0) += 1;
        }
        assert_eq!(per_worker.values().copied().collect::<std::collections::BTreeSet<_>>(), [10].into());
        // Metrics received long after the sends replace the optimistic counts.
        let later = t0 + METRICS_LAG;
        tracker.update_metrics(1, &metrics(7, 1000), later);
        assert_eq!(tracker.decode_blocks(1, later), 7.0);
        // Metrics received right after a send keep it counted.
        tracker.record_sent(2, 11, later);
        tracker.update_metrics(2, &metrics(3, 1000), later + Duration::from_millis(10));
        assert_eq!(tracker.decode_blocks(2, later), 3.0 + 11.0);
    }

    #[test]
    fn a_finished_request_stops_counting_before_metrics_catch_up() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        tracker.update_metrics(1, &metrics(0, 1000), t0);
        let a = tracker.record_sent(1, 10, t0);
        let b = tracker.record_sent(1, 4, t0);
        assert_eq!(tracker.decode_blocks(1, t0), 14.0);
        tracker.forget_sent(1, a, 10, t0);
        assert_eq!(tracker.decode_blocks(1, t0), 0.0, "a's entry goes, and is taken off the metrics (clamped)");
        tracker.forget_sent(2, b, 4, t0);
        assert_eq!(tracker.decode_blocks(1, t0), 0.0, "only the request's own entry goes");
        // Metrics taken while a ran arrive late: still corrected.
        tracker.update_metrics(1, &metrics(10, 1000), t0 + Duration::from_millis(5));
        assert_eq!(tracker.decode_blocks(1, t0), 4.0, "10 reported + 4 sent (b) - 10 ended (a)");
        // Metrics that include b arrive; b ends before the next metrics: they still count
        // it, the router does not.
        let t1 = t0 + METRICS_LAG;
        tracker.update_metrics(1, &metrics(4, 1000), t1);
        assert_eq!(tracker.decode_blocks(1, t1), 4.0);
        tracker.forget_sent(1, b, 4, t1);
        assert_eq!(tracker.decode_blocks(1, t1), 0.0);
        tracker.update_metrics(1, &metrics(4, 1000), t1 + Duration::from_millis(10));
        assert_eq!(tracker.decode_blocks(1, t1), 0.0, "metrics taken just after the end are corrected");
        tracker.update_metrics(1, &metrics(3, 1000), t1 + METRICS_LAG);
        assert_eq!(tracker.decode_blocks(1, t1 + METRICS_LAG), 3.0, "later metrics are the truth");
    }

    #[test]
    fn a_request_that_ends_before_the_first_metrics_is_not_counted_by_them() {
        // A worker's first metrics can arrive after requests to it ended (the router
        // started after the worker's last report), taken while one of them ran.
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        let a = tracker.record_sent(1, 21, t0);
        tracker.forget_sent(1, a, 21, t0 + Duration::from_millis(5));
        tracker.update_metrics(1, &metrics(21, 1000), t0 + Duration::from_millis(20));
        assert_eq!(tracker.decode_blocks(1, t0 + Duration::from_millis(20)), 0.0);
        // Metrics received a lag after the end are the truth again.
        let later = t0 + Duration::from_millis(5) + METRICS_LAG;
        tracker.update_metrics(1, &metrics(2, 1000), later);
        assert_eq!(tracker.decode_blocks(1, later), 2.0);
        // Ends long past are not kept around while no metrics come.
        for i in 0..100 {
            let id = tracker.record_sent(2, 1, later + METRICS_LAG * i);
            tracker.forget_sent(2, id, 1, later + METRICS_LAG * i);
        }
        assert_eq!(tracker.workers[&2].released.len(), 1);
    }

    #[test]
    fn without_metrics_the_inflight_blocks_are_the_load() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        tracker.start_request(1, 20);
        tracker.start_request(1, 5);
        assert_eq!((tracker.decode_blocks(1, t0), tracker.inflight(1)), (25.0, 2));
        tracker.finish_request(1, 20);
        assert_eq!((tracker.decode_blocks(1, t0), tracker.inflight(1)), (5.0, 1));
        // Stale metrics are ignored.
        tracker.update_metrics(1, &metrics(500, 1000), t0);
        assert_eq!(tracker.decode_blocks(1, t0), 500.0);
        assert_eq!(tracker.decode_blocks(1, t0 + METRICS_STALE + Duration::from_secs(1)), 5.0);
    }

    #[test]
    fn a_straggler_is_penalised() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        for _ in 0..20 {
            tracker.record_tpot(1, Duration::from_millis(10));
            tracker.record_tpot(2, Duration::from_millis(10));
            tracker.record_tpot(3, Duration::from_millis(50));
        }
        let slowness = tracker.slowness(&[1, 2, 3, 4]);
        assert_eq!((slowness[0], slowness[1], slowness[3]), (1.0, 1.0, 1.0));
        assert!((slowness[2] - 5.0).abs() < 1e-6, "{slowness:?}");
        // Worker 3 holds the whole prefix, but at 5× it does not get the request.
        let chosen = tracker.schedule(&[(1, 0), (2, 0), (3, 16)], 16, t0, &mut rng()).unwrap();
        assert_ne!(chosen.worker, 3);
        // Without the penalty it would.
        let mut off = LoadTracker::new(SchedulerConfig { straggler_threshold: f64::INFINITY, ..Default::default() });
        for _ in 0..20 {
            off.record_tpot(3, Duration::from_millis(50));
            off.record_tpot(1, Duration::from_millis(10));
        }
        assert_eq!(off.schedule(&[(1, 0), (2, 0), (3, 16)], 16, t0, &mut rng()).unwrap().worker, 3);
        // Tiny times (jitter) are no judgement either.
        let mut fast = LoadTracker::new(SchedulerConfig::default());
        for _ in 0..20 {
            fast.record_tpot(1, Duration::from_micros(100));
            fast.record_tpot(2, Duration::from_micros(900));
        }
        assert_eq!(fast.slowness(&[1, 2]), vec![1.0, 1.0]);
        // Too few samples: no judgement.
        let mut young = LoadTracker::new(SchedulerConfig::default());
        young.record_tpot(1, Duration::from_millis(10));
        young.record_tpot(2, Duration::from_millis(100));
        assert_eq!(young.slowness(&[1, 2]), vec![1.0, 1.0]);
        let timing = tracker.timing(3).unwrap();
        assert!((timing.tpot_s - 0.05).abs() < 1e-9 && timing.samples == 20);
    }

    #[test]
    fn a_few_slow_streams_do_not_make_a_worker_a_straggler() {
        let t0 = Instant::now();
        let mut tracker = LoadTracker::new(SchedulerConfig::default());
        // Worker 2 is as fast as worker 1 but one stream in three stalled (preempted when
        // its cache was full): an average would be ~10× worker 1's.
        for i in 0..60 {
            tracker.record_tpot(1, Duration::from_millis(8));
            tracker.record_tpot(2, Duration::from_millis(if i % 3 == 0 { 200 } else { 9 }));
        }
        assert_eq!(tracker.slowness(&[1, 2]), vec![1.0, 1.0]);
        assert_eq!(tracker.timing(2).unwrap().tpot_s, 0.009);
        assert_eq!(tracker.schedule(&[(1, 0), (2, 16)], 16, t0, &mut rng()).unwrap().worker, 2);
        // Slowed by its load now and then, it is not one: its fastest streams are fast.
        for i in 0..60 {
            tracker.record_tpot(2, Duration::from_millis(if i % 3 == 0 { 9 } else { 40 }));
        }
        assert_eq!(tracker.slowness(&[1, 2]), vec![1.0, 1.0]);
        // When every one of its latest streams is slow, it is one (the window follows the
        // latest: its last fast stream was the third from the end).
        for _ in 0..29 {
            tracker.record_tpot(2, Duration::from_millis(40));
        }
        assert_eq!(tracker.slowness(&[1, 2]), vec![1.0, 1.0], "one fast stream left in the window");
        tracker.record_tpot(2, Duration::from_millis(40));
        assert_eq!(tracker.slowness(&[1, 2]), vec![1.0, 5.0]);
    }

    #[test]
    fn busy_workers_are_skipped_and_all_busy_refuses() {
        let t0 = Instant::now();
        let config = SchedulerConfig { busy_threshold: Some(0.9), ..Default::default() };
        let mut tracker = LoadTracker::new(config);
        tracker.update_metrics(1, &metrics(95, 100), t0);
        tracker.update_metrics(2, &metrics(50, 100), t0);
        assert!(tracker.is_busy(1, t0) && !tracker.is_busy(2, t0));
        // Worker 1 has the prefix but is busy.
        assert_eq!(tracker.schedule(&[(1, 8), (2, 0)], 8, t0, &mut rng()).unwrap().worker, 2);
        // Requests sent count toward busy: 50 + 9 × 5 = 95.
        for _ in 0..4 {
            tracker.schedule(&[(2, 0)], 8, t0, &mut rng()).unwrap();
        }
        let err = tracker.schedule(&[(1, 0), (2, 0)], 8, t0, &mut rng()).unwrap_err();
        assert!(matches!(err, ScheduleError::AllBusy { workers: 2, .. }), "{err}");
        assert!(err.to_string().contains("busy"));
        // A worker without metrics is never busy.
        assert_eq!(tracker.schedule(&[(1, 0), (2, 0), (3, 0)], 8, t0, &mut rng()).unwrap().worker, 3);
        assert_eq!(tracker.schedule(&[], 8, t0, &mut rng()).unwrap_err(), ScheduleError::NoWorkers);
        assert!(SchedulerConfig { busy_threshold: Some(0.0), ..Default::default() }.validate().is_err());
        assert!(SchedulerConfig { straggler_threshold: 0.5, ..Default::default() }.validate().is_err());
    }
}

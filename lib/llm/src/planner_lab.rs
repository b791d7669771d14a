//! The planner lab's fleet: a trace replayed through simulated mocker engines
//! ([`SimWorker`]) on a virtual clock that the caller steps, resizing the fleet between
//! steps as a planner would.
//!
//! [`PlannerLab::advance`] runs the discrete-event loop (the next arrival, the end of a
//! replica's step or of a KV transfer, or a replica becoming ready, whichever is
//! earliest; nothing sleeps) up to a simulated time and returns what happened in that
//! window: each finished request's TTFT and ITL, arrivals, queue depth and every
//! replica's load. [`PlannerLab::set_replicas`] resizes it the way a connector does: a
//! new replica costs from the moment it is asked for, is ready `startup_s` later, and
//! runs its first `warmup_s` of steps `warmup_factor` times slower (the warm-up a planner
//! must leave out of its model); a removed replica that is still starting goes at once, a
//! ready one drains (it takes no new request, finishes those it holds, then goes).
//! Arrivals with no ready replica wait at the frontend, in order, and are dispatched when
//! one becomes ready.
//! Requests go to the ready replicas through the frontend's KV selector without KV events
//! (`approx`: its own predictions of each replica's cache, and the replicas' load
//! reports, refreshed at every arrival and step), replaying on the lab's clock, so a
//! replica with a backlog gets fewer new requests as it would behind the frontend. The
//! selector times every stream on that clock too (sent at its arrival, each token
//! observed as it comes), as the frontend times its streams.
//! With a busy threshold ([`PlannerLabConfig::busy_threshold`]) the frontend also holds
//! arrivals while every ready replica is busy, so a backlog waits where any replica,
//! a new one included, can take it, instead of in one replica's engine queue; with a
//! busy wait ([`PlannerLabConfig::busy_wait_s`]) an arrival held that long while a
//! replica was ready is refused, as the frontend's `--busy-wait-s` refuses it with a 503.
//!
//! **Disaggregated** ([`PlannerLabConfig::disagg`]): two pools, [`DisaggRole::Prefill`] and
//! [`DisaggRole::Decode`], each resized on its own ([`PlannerLab::set_role_replicas`]), as
//! our disaggregated serving path runs (crate::disagg). An arrival goes to a ready decode
//! replica, picked by the decode pool's selector (arrivals wait at the frontend, in order,
//! while none is ready or, with a busy threshold, every one is busy). That replica decides
//! where the prompt is prefilled by the decode worker's rule,
//! [`DisaggConfig::prefill_remotely`] with the workers' settings ([`DisaggPools::settings`],
//! the real defaults): remotely only while a prefill replica is ready, the prompt's part
//! not in its own cache is longer than `max_local_prefill_length`, and the prefill queue
//! holds fewer than `max_prefill_queue_size` jobs. A local prefill runs on the decode
//! replica like an aggregated request. A remote one is a job on the lab's one FIFO prefill
//! queue; a ready prefill replica pulls the oldest job while it holds fewer than
//! `max_concurrent_prefills` (our prefill worker pulls while one of its slots is free; of
//! several with room, the one holding the fewest jobs pulls first), computes the prompt as
//! the mocker's `prefill_for_transfer` does (a one-token generation whose token is not
//! sent; the prompt's full blocks stay cached there), and its full blocks go to the decode
//! replica that queued it (`blocks · block_size · kv_bytes_per_token` bytes; every
//! replica sends on one link and receives on another, each of `kv_transfer_gbps`, and the
//! transfers under way share them max-min fairly, `bandwidth.rs`: a lone transfer takes
//! the mocker's transfer time), where they are stored as cached (`import_kv`, as
//! `receive_kv`) and the request is added: the decode replica computes the prompt's uncached tail and
//! emits the first token. A remote prefill whose KV has not landed
//! `remote_prefill_timeout` after it was queued is given up, as the decode worker's one
//! bound on its wait gives it up: a job still in the queue leaves it, a prefill under way
//! is cancelled on its prefill replica (whose slot frees; the real prefill worker stops at
//! the job's deadline too), a transfer under way stops, and the decode replica prefills
//! the prompt itself (`fallback_prefills`). A request's TTFT thus spans the frontend
//! queue and either its local prefill or the prefill queue, the remote prefill, the
//! transfer and the decode replica's first step. A draining prefill replica pulls no more and finishes (and hands over) what it
//! holds; a draining decode replica takes no new arrival and finishes its decodes and its
//! remote prefills still under way (their KV lands on it).
//!
//! [`closed_loop_point`] (`point.rs`) measures one replica at a fixed concurrency: the
//! capacity profile the lab's planner uses, taken from the same simulated engine.
//! The same requests, configuration and calls give the same windows.

mod bandwidth;
mod point;

pub use point::{closed_loop_point, PointStats};

use bandwidth::fair_rates;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::disagg::{DisaggConfig, DisaggRole};
use crate::engines::mocker::{MockerArgs, SimOutput, SimWorker};
use crate::lab_trace::{synthesize_tokens, LabError, TraceRequest, DEFAULT_LAB_GPU_BLOCKS, DEFAULT_TRACE_BLOCK_SIZE};
use crate::kv_router::{KvRouter, KvRouterConfig, SchedulerConfig};
use crate::routing::{KvSelector, Outcome, Pick, Selector};

/// The pools of a disaggregated lab at time 0, and the settings its decode and prefill
/// replicas run with.
#[derive(Debug, Clone, PartialEq)]
pub struct DisaggPools {
    /// Prefill replicas ready (and warm) at time 0; may be 0.
    pub prefill_replicas: usize,
    /// Decode replicas ready (and warm) at time 0; may be 0.
    pub decode_replicas: usize,
    /// The workers' disaggregation settings (its `role` is not used): a decode replica
    /// prefills remotely by [`DisaggConfig::prefill_remotely`]
    /// (`max_local_prefill_length`, `max_prefill_queue_size`), a prefill replica holds
    /// at most `max_concurrent_prefills` jobs, and a remote prefill whose KV has not
    /// landed `remote_prefill_timeout` after it was queued is prefilled by its decode
    /// replica.
    pub settings: DisaggConfig,
}

impl DisaggPools {
    /// `prefill_replicas` and `decode_replicas` with the workers' default settings.
    pub fn new(prefill_replicas: usize, decode_replicas: usize) -> Self {
        DisaggPools { prefill_replicas, decode_replicas, settings: DisaggConfig::default() }
    }
}

/// The planner lab's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerLabConfig {
    /// Replicas ready (and warm) at time 0; may be 0. Aggregated only: 0 with `disagg`.
    pub replicas: usize,
    /// Tokens per trace block.
    pub trace_block_size: usize,
    /// Every replica's engine; default the mocker's with [`DEFAULT_LAB_GPU_BLOCKS`].
    /// Its `kv_bytes_per_token` and `kv_transfer_gbps` time a disaggregated handoff.
    pub engine: MockerArgs,
    /// Arrival rate multiplier: timestamps are divided by it.
    pub time_scale: f64,
    /// Seconds from asking for a replica to its being ready.
    pub startup_s: f64,
    /// Seconds after becoming ready during which a new replica's steps are slower.
    pub warmup_s: f64,
    /// How much slower (≥ 1).
    pub warmup_factor: f64,
    /// The router's busy threshold (fraction of a replica's KV blocks its predicted
    /// demand may reach, as `--busy-threshold`): while every ready replica is busy,
    /// arrivals wait at the frontend, in order, and go to the first replica that is not
    /// (or becomes ready). `None`: every arrival goes to a replica at once and queues there.
    /// With `disagg` it holds arrivals from busy decode replicas the same way.
    pub busy_threshold: Option<f64>,
    /// With a busy threshold, the frontend's busy wait (`--busy-wait-s`): an arrival still
    /// held this many seconds after it arrived is refused (counted in
    /// [`WindowStats::rejected`]) if a replica of the pool is ready then; with none ready
    /// it waits on for one, as at the fleet's start. `None`: held without a bound.
    pub busy_wait_s: Option<f64>,
    /// Prefill and decode pools instead of aggregated replicas (the module's docstring).
    pub disagg: Option<DisaggPools>,
}

impl Default for PlannerLabConfig {
    fn default() -> Self {
        PlannerLabConfig {
            replicas: 1,
            trace_block_size: DEFAULT_TRACE_BLOCK_SIZE,
            engine: MockerArgs { num_gpu_blocks: DEFAULT_LAB_GPU_BLOCKS, ..MockerArgs::default() },
            time_scale: 1.0,
            startup_s: 30.0,
            warmup_s: 10.0,
            warmup_factor: 2.0,
            busy_threshold: None,
            busy_wait_s: None,
            disagg: None,
        }
    }
}

impl PlannerLabConfig {
    /// Check the ranges.
    pub fn validate(&self) -> Result<(), LabError> {
        let invalid = |m: String| Err(LabError::Invalid(m));
        if self.trace_block_size == 0 {
            return invalid("the trace block size must be at least 1".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return invalid(format!("the time scale must be > 0, got {}", self.time_scale));
        }
        for (name, value) in [("start-up", self.startup_s), ("warm-up", self.warmup_s)] {
            if !(value.is_finite() && value >= 0.0) {
                return invalid(format!("the {name} time must be >= 0 seconds, got {value}"));
            }
        }
        if !(self.warmup_factor.is_finite() && self.warmup_factor >= 1.0) {
            return invalid(format!("the warm-up factor must be >= 1, got {}", self.warmup_factor));
        }
        if let Some(t) = self.busy_threshold {
            if !(t > 0.0 && t <= 1.0) {
                return invalid(format!("the busy threshold must be in (0, 1], got {t}"));
            }
        }
        if let Some(wait) = self.busy_wait_s {
            if self.busy_threshold.is_none() {
                return invalid("a busy wait needs a busy threshold".into());
            }
            if !(wait.is_finite() && wait > 0.0) {
                return invalid(format!("the busy wait must be > 0 seconds, got {wait}"));
            }
        }
        if self.disagg.is_some() && self.replicas != 0 {
            return invalid(format!("a disaggregated lab has no aggregated replicas: replicas must be 0, got {}", self.replicas));
        }
        if let Some(pools) = &self.disagg {
            let timeout = pools.settings.remote_prefill_timeout;
            if pools.settings.max_concurrent_prefills == 0 || timeout.is_zero() {
                return invalid(format!(
                    "a prefill replica needs at least 1 job at a time and a remote prefill timeout > 0, got {} and {timeout:?}",
                    pools.settings.max_concurrent_prefills
                ));
            }
        }
        self.engine.validate().map_err(|e| LabError::Invalid(format!("engine arguments: {e}")))
    }

    /// The pools.
    fn roles(&self) -> &'static [DisaggRole] {
        if self.disagg.is_some() {
            &[DisaggRole::Prefill, DisaggRole::Decode]
        } else {
            &[DisaggRole::Agg]
        }
    }

    /// The pool that takes arrivals, through its selector.
    fn entry(&self) -> DisaggRole {
        if self.disagg.is_some() {
            DisaggRole::Decode
        } else {
            DisaggRole::Agg
        }
    }
}

/// Where `role`'s retired replica-time is kept.
fn role_index(role: DisaggRole) -> usize {
    match role {
        DisaggRole::Agg => 0,
        DisaggRole::Prefill => 1,
        DisaggRole::Decode => 2,
    }
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaState {
    /// Asked for, not ready yet.
    Starting,
    /// Taking requests.
    Ready,
    /// Removed: finishing the requests it holds, taking no new one.
    Draining,
}

impl ReplicaState {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Starting => "starting",
            ReplicaState::Ready => "ready",
            ReplicaState::Draining => "draining",
        }
    }
}

/// One replica's load at the end of a window.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaLoad {
    /// Its id (0, 1, … in the order they were asked for, over both pools).
    pub id: u64,
    /// Its pool.
    pub role: DisaggRole,
    /// Its state.
    pub state: ReplicaState,
    /// When it became ready (seconds), if it has.
    pub ready_s: Option<f64>,
    /// Requests it is running.
    pub running: u64,
    /// Requests it holds waiting to be scheduled.
    pub waiting: u64,
    /// KV blocks in use.
    pub kv_active_blocks: u64,
}

/// A request that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedRequest {
    /// Its index in the request list.
    pub index: usize,
    /// Arrival (seconds).
    pub arrival_s: f64,
    /// Time to its first token (ms); `None` when it produced none (failed).
    pub ttft_ms: Option<f64>,
    /// Its mean gap between tokens (ms); `None` with fewer than two tokens.
    pub itl_ms: Option<f64>,
    /// Prompt tokens.
    pub input_length: usize,
    /// The replica that served it (disaggregated: the decode replica).
    pub replica: u64,
    /// Disaggregated: the prefill replica that computed its prompt; `None` when its
    /// decode replica prefilled it locally.
    pub prefill_replica: Option<u64>,
}

/// What happened between two calls of [`PlannerLab::advance`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WindowStats {
    /// The window, in simulated seconds.
    pub start_s: f64,
    /// Its end.
    pub end_s: f64,
    /// Requests that arrived in it.
    pub arrivals: usize,
    /// Their prompt tokens, summed.
    pub arrival_input_tokens: u64,
    /// Requests that ended in it, in the order they ended.
    pub finished: Vec<FinishedRequest>,
    /// Requests refused: a prompt larger than a replica's cache, or one held at the
    /// frontend past the busy wait ([`PlannerLabConfig::busy_wait_s`]).
    pub rejected: usize,
    /// Requests that failed on a replica being removed (a drain that lost them).
    pub failed_at_scale_down: usize,
    /// Disaggregated: prefills the decode replicas sent to the prefill queue in it.
    pub remote_prefills: usize,
    /// Disaggregated: prefills the decode replicas ran themselves in it: by the rule, or
    /// a remote one given up (`fallback_prefills`; counted among the remote ones when it
    /// was queued).
    pub local_prefills: usize,
    /// Disaggregated: remote prefills given up in it because their KV had not landed
    /// `remote_prefill_timeout` after they were queued (still queued, prefilling, or in
    /// transfer), each then prefilled by its decode replica.
    pub fallback_prefills: usize,
    /// At the end: requests waiting at the frontend for a ready replica (disaggregated:
    /// a decode replica).
    pub frontend_queue: usize,
    /// At the end, disaggregated: jobs in the shared prefill queue, not yet pulled by a
    /// prefill replica.
    pub prefill_queue: usize,
    /// At the end, disaggregated: KV transfers under way to a decode replica.
    pub transferring: usize,
    /// At the end: requests arrived and not finished (the frontend queue included).
    pub inflight: usize,
    /// At the end: every replica's load.
    pub replicas: Vec<ReplicaLoad>,
    /// Replica-seconds spent since time 0 (each replica from being asked for until gone).
    pub replica_seconds: f64,
    /// The same per pool, in the lab's pool order (`agg`; or `prefill`, `decode`).
    pub role_seconds: Vec<(DisaggRole, f64)>,
}

#[derive(Debug)]
struct Replica {
    id: u64,
    role: DisaggRole,
    worker: SimWorker,
    state: ReplicaState,
    requested_ms: f64,
    ready_ms: f64,
    /// Steps starting before this are warm-up steps.
    warm_from_ms: f64,
    step_end: Option<f64>,
    /// A decode replica: its remote prefills under way (queued, prefilling, or their KV
    /// in transfer to it).
    incoming: usize,
}

#[derive(Debug)]
struct Stream {
    /// The replica serving it (disaggregated: its decode replica).
    replica: u64,
    /// Its replica's pick, ended with it.
    pick: Option<Pick>,
    prefill_replica: Option<u64>,
    /// Its remote prefill produced its (unsent) token.
    prefilled: bool,
    /// While its remote prefill is outstanding (queued, prefilling, or its KV in
    /// transfer): when it is given up (ms).
    remote_deadline_ms: Option<f64>,
    first: Option<f64>,
    last: Option<f64>,
    tokens: u32,
}

/// A KV handoff under way.
#[derive(Debug)]
struct Transfer {
    index: usize,
    /// The prefill replica sending it.
    from: u64,
    /// The decode replica receiving it.
    replica: u64,
    /// Bytes left to move at `since_ms`, moving at `rate` bytes/ms since.
    bytes: f64,
    since_ms: f64,
    rate: f64,
    end_ms: f64,
    tokens: Vec<u32>,
}

/// A remote prefill queued by a decode replica, and when it is given up.
#[derive(Debug)]
struct PrefillJob {
    index: usize,
    /// Its queueing time plus `remote_prefill_timeout` (ms).
    deadline_ms: f64,
}

/// One pool's selector, and the requests waiting for one of its replicas.
#[derive(Debug)]
struct Pool {
    role: DisaggRole,
    router: Arc<KvRouter>,
    selector: KvSelector,
    queue: VecDeque<usize>,
}

/// A simulated fleet stepped by its caller (see the module's docstring).
#[derive(Debug)]
pub struct PlannerLab {
    config: PlannerLabConfig,
    requests: Vec<TraceRequest>,
    /// Arrival of each request (ms), and the request indices by arrival.
    arrival_ms: Vec<f64>,
    order: Vec<usize>,
    next: usize,
    now_ms: f64,
    replicas: Vec<Replica>,
    next_id: u64,
    /// Replica-milliseconds of the replicas already gone, in all and per role.
    retired_ms: f64,
    retired_role_ms: [f64; 3],
    /// The pools requests are routed to: `agg`, or `decode` (disaggregated; the prefill
    /// replicas pull from `prefill_queue` instead).
    pools: Vec<Pool>,
    /// Disaggregated: the one prefill queue (request indices), oldest first.
    prefill_queue: VecDeque<usize>,
    /// Disaggregated: the remote prefills queued, oldest (so earliest deadline) first;
    /// one whose stream no longer waits for it is dropped when it reaches the front.
    remote_jobs: VecDeque<PrefillJob>,
    transfers: Vec<Transfer>,
    streams: FxHashMap<usize, Stream>,
    /// The virtual clock's origin for the routers.
    base: Instant,
    window: WindowStats,
    outputs: Vec<SimOutput>,
}

impl PlannerLab {
    /// A fleet of `config.replicas` ready replicas (or, disaggregated, of
    /// `config.disagg`'s pools) at time 0, to replay `requests` (their timestamps in ms,
    /// divided by `config.time_scale`).
    pub fn new(requests: Vec<TraceRequest>, config: PlannerLabConfig) -> Result<Self, LabError> {
        config.validate()?;
        if let Some(bad) = requests.iter().find(|r| !(r.timestamp.is_finite() && r.timestamp >= 0.0)) {
            return Err(LabError::Invalid(format!("bad timestamp {}", bad.timestamp)));
        }
        let arrival_ms: Vec<f64> = requests.iter().map(|r| r.timestamp / config.time_scale).collect();
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by(|&a, &b| arrival_ms[a].total_cmp(&arrival_ms[b]));
        let base = Instant::now();
        let pools = [config.entry()]
            .into_iter()
            .map(|role| {
                let router = KvRouter::new(KvRouterConfig {
                    block_size: config.engine.block_size as u32,
                    use_kv_events: false,
                    scheduler: SchedulerConfig { busy_threshold: config.busy_threshold, ..Default::default() },
                    ..Default::default()
                });
                let seed = if role == DisaggRole::Decode { config.engine.seed ^ 0xDEC0DE } else { config.engine.seed };
                let selector = KvSelector::replaying(router.clone(), base, seed);
                Pool { role, router, selector, queue: VecDeque::new() }
            })
            .collect();
        let mut lab = PlannerLab {
            requests,
            arrival_ms,
            order,
            next: 0,
            now_ms: 0.0,
            replicas: Vec::new(),
            next_id: 0,
            retired_ms: 0.0,
            retired_role_ms: [0.0; 3],
            pools,
            prefill_queue: VecDeque::new(),
            remote_jobs: VecDeque::new(),
            transfers: Vec::new(),
            streams: FxHashMap::default(),
            base,
            window: WindowStats::default(),
            outputs: Vec::new(),
            config,
        };
        let initial = match &lab.config.disagg {
            Some(pools) => vec![(DisaggRole::Prefill, pools.prefill_replicas), (DisaggRole::Decode, pools.decode_replicas)],
            None => vec![(DisaggRole::Agg, lab.config.replicas)],
        };
        for (role, n) in initial {
            for _ in 0..n {
                lab.add_replica(role, true)?;
            }
        }
        Ok(lab)
    }

    /// The simulated time (seconds).
    pub fn now_s(&self) -> f64 {
        self.now_ms / 1000.0
    }

    /// The last arrival (seconds), 0 without requests.
    pub fn last_arrival_s(&self) -> f64 {
        self.order.last().map_or(0.0, |&i| self.arrival_ms[i] / 1000.0)
    }

    /// Whether every request has arrived and ended.
    pub fn done(&self) -> bool {
        self.next == self.order.len() && self.streams.is_empty() && self.pools.iter().all(|p| p.queue.is_empty())
    }

    /// Replicas (starting, ready, draining), over every pool.
    pub fn counts(&self) -> (usize, usize, usize) {
        let count = |s| self.replicas.iter().filter(|r| r.state == s).count();
        (count(ReplicaState::Starting), count(ReplicaState::Ready), count(ReplicaState::Draining))
    }

    /// Replicas of `role`'s pool (starting, ready, draining).
    pub fn role_counts(&self, role: DisaggRole) -> (usize, usize, usize) {
        let count = |s| self.replicas.iter().filter(|r| r.role == role && r.state == s).count();
        (count(ReplicaState::Starting), count(ReplicaState::Ready), count(ReplicaState::Draining))
    }

    /// The pools: `agg`, or `prefill` and `decode`.
    pub fn roles(&self) -> &'static [DisaggRole] {
        self.config.roles()
    }

    /// Replica-seconds spent so far.
    pub fn replica_seconds(&self) -> f64 {
        let live: f64 = self.replicas.iter().map(|r| self.now_ms - r.requested_ms).sum();
        (self.retired_ms + live) / 1000.0
    }

    /// Replica-seconds of `role`'s pool spent so far.
    pub fn role_seconds(&self, role: DisaggRole) -> f64 {
        let live: f64 = self.replicas.iter().filter(|r| r.role == role).map(|r| self.now_ms - r.requested_ms).sum();
        (self.retired_role_ms[role_index(role)] + live) / 1000.0
    }

    fn at(&self, ms: f64) -> Instant {
        self.base + Duration::from_secs_f64(ms / 1000.0)
    }

    /// The routed pool of `role`; `None` for the prefill replicas, which pull.
    fn pool(&self, role: DisaggRole) -> Option<usize> {
        self.pools.iter().position(|p| p.role == role)
    }

    /// Replica `i`'s load as its pool's router sees it, at `t`.
    fn report_load(&self, i: usize, t: f64) {
        let r = &self.replicas[i];
        if let Some(p) = self.pool(r.role) {
            self.pools[p].router.load().lock().update_metrics(r.id, &r.worker.metrics(), self.at(t));
        }
    }

    /// Forget a replica that is gone (its cost counted to now).
    fn retire(&mut self, i: usize) {
        let gone = self.replicas.remove(i);
        self.retired_ms += self.now_ms - gone.requested_ms;
        self.retired_role_ms[role_index(gone.role)] += self.now_ms - gone.requested_ms;
        if let Some(p) = self.pool(gone.role) {
            self.pools[p].router.remove_worker(gone.id);
        }
    }

    fn add_replica(&mut self, role: DisaggRole, warm: bool) -> Result<(), LabError> {
        let worker = SimWorker::new(self.config.engine.clone(), 1.0).map_err(|e| LabError::Invalid(e.to_string()))?;
        let now = self.now_ms;
        let startup = if warm { 0.0 } else { self.config.startup_s * 1000.0 };
        let warmup = if warm { 0.0 } else { self.config.warmup_s * 1000.0 };
        self.replicas.push(Replica {
            id: self.next_id,
            role,
            worker,
            state: if startup == 0.0 { ReplicaState::Ready } else { ReplicaState::Starting },
            requested_ms: now,
            ready_ms: now + startup,
            warm_from_ms: now + startup + warmup,
            step_end: None,
            incoming: 0,
        });
        self.next_id += 1;
        Ok(())
    }

    /// Resize an aggregated lab to `n` replicas starting or ready: new ones start (ready
    /// after the start-up delay); removing takes starting replicas first (the latest asked
    /// for), then drains the ready replica holding the fewest requests (the youngest on a
    /// tie). A disaggregated lab is resized per pool ([`PlannerLab::set_role_replicas`]).
    pub fn set_replicas(&mut self, n: usize) -> Result<(), LabError> {
        if self.config.disagg.is_some() {
            return Err(LabError::Invalid("a disaggregated lab is resized per role (prefill, decode)".into()));
        }
        self.set_role_replicas(DisaggRole::Agg, n)
    }

    /// Resize `role`'s pool to `n` replicas starting or ready, as
    /// [`PlannerLab::set_replicas`] does the aggregated fleet.
    pub fn set_role_replicas(&mut self, role: DisaggRole, n: usize) -> Result<(), LabError> {
        if !self.roles().contains(&role) {
            let roles: Vec<&str> = self.roles().iter().map(|r| r.as_str()).collect();
            return Err(LabError::Invalid(format!("this lab has no {} pool (its roles: {})", role.as_str(), roles.join(", "))));
        }
        let (starting, ready, _) = self.role_counts(role);
        let current = starting + ready;
        for _ in current..n {
            self.add_replica(role, false)?;
        }
        if n > current {
            // A start-up delay of 0: ready at once, and the queue can move.
            self.serve_queue(role, self.now_ms);
        }
        for _ in n..current {
            let starting = self.replicas.iter().rposition(|r| r.role == role && r.state == ReplicaState::Starting);
            if let Some(i) = starting {
                self.retire(i);
                continue;
            }
            let victim = self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.role == role && r.state == ReplicaState::Ready)
                .min_by_key(|(_, r)| (r.worker.requests() + r.incoming, std::cmp::Reverse(r.id)))
                .map(|(i, _)| i);
            if let Some(i) = victim {
                self.replicas[i].state = ReplicaState::Draining;
                self.retire_if_drained(i);
            }
        }
        Ok(())
    }

    /// Remove replica `i` if it drained; whether it did.
    fn retire_if_drained(&mut self, i: usize) -> bool {
        let r = &self.replicas[i];
        if r.state != ReplicaState::Draining || r.worker.requests() > 0 || r.step_end.is_some() || r.incoming > 0 {
            return false;
        }
        self.retire(i);
        true
    }

    fn step_ms(&self, i: usize, ms: f64, t: f64) -> f64 {
        if t < self.replicas[i].warm_from_ms {
            ms * self.config.warmup_factor
        } else {
            ms
        }
    }

    fn start_step(&mut self, i: usize, t: f64) {
        if self.replicas[i].step_end.is_none() {
            if let Some(ms) = self.replicas[i].worker.start_step() {
                self.replicas[i].step_end = Some(t + self.step_ms(i, ms, t));
            }
        }
    }

    /// Send request `index` to a ready replica of `role` (aggregated or decode) at `t`;
    /// false when none is ready (or, with a busy threshold, none is free). A decode
    /// replica prefills it locally, or queues a remote prefill, by the workers' rule.
    fn dispatch(&mut self, role: DisaggRole, index: usize, t: f64) -> bool {
        let ids: Vec<u64> =
            self.replicas.iter().filter(|r| r.role == role && r.state == ReplicaState::Ready).map(|r| r.id).collect();
        if ids.is_empty() {
            return false;
        }
        let tokens = synthesize_tokens(&self.requests[index], index, self.config.trace_block_size);
        for i in 0..self.replicas.len() {
            if self.replicas[i].role == role && self.replicas[i].state == ReplicaState::Ready {
                self.report_load(i, t);
            }
        }
        let Some(p) = self.pool(role) else { return false };
        self.pools[p].selector.set_clock(self.at(t));
        let Ok(pick) = self.pools[p].selector.select(&tokens, &ids) else { return false };
        // Sent now on the lab's clock: its prefill counts as waiting from then.
        let pick = Pick { load: pick.load.map(|l| l.started_at(self.at(t))), ..pick };
        let Some(i) = self.replicas.iter().position(|r| r.id == pick.instance) else { return false };
        let remote = role == DisaggRole::Decode && self.prefills_remotely(i, &tokens);
        if role == DisaggRole::Decode {
            if remote {
                self.window.remote_prefills += 1;
            } else {
                self.window.local_prefills += 1;
            }
        }
        if !remote && self.replicas[i].worker.add(index as u64, tokens, self.requests[index].output_length.max(1)).is_err() {
            self.pools[p].selector.on_end(pick, Outcome::Failed);
            self.window.rejected += 1;
            return true;
        }
        let stream = Stream {
            replica: pick.instance,
            pick: Some(pick),
            prefill_replica: None,
            prefilled: false,
            remote_deadline_ms: None,
            first: None,
            last: None,
            tokens: 0,
        };
        self.streams.insert(index, stream);
        if remote {
            self.replicas[i].incoming += 1;
            let deadline_ms = t + self.remote_timeout_ms().unwrap_or(f64::INFINITY);
            if let Some(stream) = self.streams.get_mut(&index) {
                stream.remote_deadline_ms = Some(deadline_ms);
            }
            self.remote_jobs.push_back(PrefillJob { index, deadline_ms });
            self.prefill_queue.push_back(index);
            self.pull_prefills(t);
        } else {
            self.start_step(i, t);
        }
        true
    }

    /// Whether decode replica `i` sends the prefill of `tokens` to the prefill queue, as
    /// the decode worker decides: only while a prefill replica is up, by
    /// [`DisaggConfig::prefill_remotely`] over its own cached prefix and the queue's length.
    fn prefills_remotely(&self, i: usize, tokens: &[u32]) -> bool {
        let Some(pools) = &self.config.disagg else { return false };
        let prefill_up = self.replicas.iter().any(|r| r.role == DisaggRole::Prefill && r.state == ReplicaState::Ready);
        if tokens.is_empty() || !prefill_up {
            return false;
        }
        let cached = self.replicas[i].worker.cached_prefix_tokens(tokens);
        pools.settings.prefill_remotely(tokens.len(), cached, self.prefill_queue.len())
    }

    /// Ready prefill replicas pull jobs from the queue, oldest first, while one holds
    /// fewer than `max_concurrent_prefills` (a prefill worker pulls while it has a free
    /// slot); of several with room, the one holding the fewest jobs (the lowest id on a
    /// tie) pulls first. A draining prefill replica pulls nothing.
    fn pull_prefills(&mut self, t: f64) {
        let Some(pools) = &self.config.disagg else { return };
        let slots = pools.settings.max_concurrent_prefills;
        while !self.prefill_queue.is_empty() {
            let puller = self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.role == DisaggRole::Prefill && r.state == ReplicaState::Ready && r.worker.requests() < slots)
                .min_by_key(|(_, r)| (r.worker.requests(), r.id))
                .map(|(i, _)| i);
            let Some(i) = puller else { break };
            let Some(index) = self.prefill_queue.pop_front() else { break };
            let tokens = synthesize_tokens(&self.requests[index], index, self.config.trace_block_size);
            if self.replicas[i].worker.add(index as u64, tokens, 1).is_err() {
                // A prompt larger than the engine's cache: as after any failed remote
                // prefill, its decode replica tries it (and refuses it too).
                self.prefill_locally(index, t);
                continue;
            }
            let id = self.replicas[i].id;
            if let Some(stream) = self.streams.get_mut(&index) {
                stream.prefill_replica = Some(id);
            }
            self.start_step(i, t);
        }
    }

    /// The decode workers' `remote_prefill_timeout` (ms); `None` when aggregated.
    fn remote_timeout_ms(&self) -> Option<f64> {
        Some(self.config.disagg.as_ref()?.settings.remote_prefill_timeout.as_secs_f64() * 1000.0)
    }

    /// When the oldest outstanding remote prefill is given up (ms), after dropping the
    /// jobs at the front that are no longer outstanding.
    fn remote_deadline(&mut self) -> Option<f64> {
        while let Some(job) = self.remote_jobs.front() {
            if self.streams.get(&job.index).is_some_and(|s| s.remote_deadline_ms.is_some()) {
                return Some(job.deadline_ms);
            }
            self.remote_jobs.pop_front();
        }
        None
    }

    /// The oldest outstanding remote prefill's KV did not land within the remote prefill
    /// timeout: give it up wherever it is (the queue, a prefill replica, or a link) and
    /// have its decode replica prefill the prompt, as the decode worker does when its
    /// wait runs out.
    fn expire_prefill(&mut self, t: f64) {
        let Some(job) = self.remote_jobs.pop_front() else { return };
        let index = job.index;
        self.window.fallback_prefills += 1;
        if let Some(at) = self.prefill_queue.iter().position(|&queued| queued == index) {
            self.prefill_queue.remove(at);
        } else if let Some(k) = self.transfers.iter().position(|x| x.index == index) {
            self.settle_transfers(t);
            self.transfers.remove(k);
            self.share_links(t);
        } else if let Some(id) = self.streams.get_mut(&index).and_then(|s| s.prefill_replica.take()) {
            if let Some(i) = self.replicas.iter().position(|r| r.id == id) {
                self.replicas[i].worker.cancel(index as u64);
                if !self.retire_if_drained(i) {
                    self.start_step(i, t);
                }
            }
        }
        if let Some(stream) = self.streams.get_mut(&index) {
            stream.prefill_replica = None;
        }
        self.prefill_locally(index, t);
        // A prefill slot may have freed.
        self.pull_prefills(t);
    }

    /// Request `index`'s remote prefill did not happen: its decode replica computes the
    /// prompt itself.
    fn prefill_locally(&mut self, index: usize, t: f64) {
        let Some(stream) = self.streams.get_mut(&index) else { return };
        stream.remote_deadline_ms = None;
        let replica = stream.replica;
        let Some(i) = self.replicas.iter().position(|r| r.id == replica) else {
            return;
        };
        self.replicas[i].incoming -= 1;
        self.window.local_prefills += 1;
        let tokens = synthesize_tokens(&self.requests[index], index, self.config.trace_block_size);
        self.decode(i, index, tokens, t);
    }

    /// Decode replica `i` takes request `index`, whose prompt's KV it may hold already.
    fn decode(&mut self, i: usize, index: usize, tokens: Vec<u32>, t: f64) {
        let output_length = self.requests[index].output_length.max(1);
        if self.replicas[i].worker.add(index as u64, tokens, output_length).is_err() {
            // A prompt larger than the engine's cache (both pools run the same engine).
            if let (Some(pick), Some(p)) = (self.streams.remove(&index).and_then(|s| s.pick), self.pool(DisaggRole::Decode)) {
                self.pools[p].selector.on_end(pick, Outcome::Failed);
            }
            self.window.rejected += 1;
            self.retire_if_drained(i);
            return;
        }
        self.start_step(i, t);
        self.report_load(i, t);
    }

    /// Let `role`'s waiting requests move: the frontend's queue to a routed pool, or the
    /// prefill queue to the prefill replicas.
    fn serve_queue(&mut self, role: DisaggRole, t: f64) {
        if role == DisaggRole::Prefill {
            self.pull_prefills(t);
        } else {
            self.dispatch_queue(role, t);
        }
    }

    /// When the oldest request held at the frontend is refused (ms): its arrival plus the
    /// busy wait, not before now, while a replica of the pool that takes arrivals is ready
    /// (with none ready the frontend waits for one: no bound). `None`: no busy wait, or
    /// nothing held.
    fn hold_deadline(&self) -> Option<f64> {
        let wait_ms = self.config.busy_wait_s? * 1000.0;
        let entry = self.config.entry();
        let &index = self.pools[self.pool(entry)?].queue.front()?;
        self.replicas
            .iter()
            .any(|r| r.role == entry && r.state == ReplicaState::Ready)
            .then(|| (self.arrival_ms[index] + wait_ms).max(self.now_ms))
    }

    /// Refuse the requests held at the frontend since `busy_wait_s` or longer (the
    /// frontend's 503 past its busy wait): the queue is in arrival order.
    fn refuse_held(&mut self, t: f64) {
        let Some(wait_ms) = self.config.busy_wait_s.map(|s| s * 1000.0) else { return };
        let Some(p) = self.pool(self.config.entry()) else { return };
        while let Some(&index) = self.pools[p].queue.front() {
            if self.arrival_ms[index] + wait_ms > t {
                break;
            }
            self.pools[p].queue.pop_front();
            self.window.rejected += 1;
        }
    }

    fn dispatch_queue(&mut self, role: DisaggRole, t: f64) {
        let Some(p) = self.pool(role) else { return };
        while let Some(&index) = self.pools[p].queue.front() {
            if !self.dispatch(role, index, t) {
                break;
            }
            self.pools[p].queue.pop_front();
        }
    }

    /// Prefill replica `i` starts sending request `index`'s full KV blocks to decode
    /// replica `to`; the transfers under way share the links anew.
    fn start_transfer(&mut self, index: usize, i: usize, to: u64, t: f64) {
        let tokens = synthesize_tokens(&self.requests[index], index, self.config.trace_block_size);
        let engine = &self.config.engine;
        let blocks = tokens.len() / engine.block_size;
        let bytes = (blocks * engine.block_size) as f64 * engine.kv_bytes_per_token as f64;
        self.settle_transfers(t);
        let from = self.replicas[i].id;
        self.transfers.push(Transfer { index, from, replica: to, bytes, since_ms: t, rate: 0.0, end_ms: t, tokens });
        self.share_links(t);
    }

    /// Move the transfers under way on to `t`, at their rates.
    fn settle_transfers(&mut self, t: f64) {
        for transfer in &mut self.transfers {
            transfer.bytes = (transfer.bytes - transfer.rate * (t - transfer.since_ms)).max(0.0);
            transfer.since_ms = t;
        }
    }

    /// From `t`, split each replica's send and receive links (`kv_transfer_gbps` each)
    /// among the transfers under way, and time their ends.
    fn share_links(&mut self, t: f64) {
        let flows: Vec<(u64, u64)> = self.transfers.iter().map(|x| (x.from, x.replica)).collect();
        let bytes_per_ms = self.config.engine.kv_transfer_gbps * 1e6;
        for (transfer, rate) in self.transfers.iter_mut().zip(fair_rates(&flows, bytes_per_ms)) {
            transfer.rate = rate;
            transfer.end_ms = t + transfer.bytes / rate;
        }
    }

    /// KV transfer `k` arrived: its blocks are cached on the decode replica, which
    /// takes the request; the other transfers share the links anew.
    fn land(&mut self, k: usize, t: f64) {
        self.settle_transfers(t);
        let transfer = self.transfers.remove(k);
        self.share_links(t);
        if let Some(stream) = self.streams.get_mut(&transfer.index) {
            stream.remote_deadline_ms = None;
        }
        let Some(i) = self.replicas.iter().position(|r| r.id == transfer.replica) else { return };
        self.replicas[i].incoming -= 1;
        self.replicas[i].worker.import_kv(&transfer.tokens);
        self.decode(i, transfer.index, transfer.tokens, t);
    }

    /// Prefill replica `i` ended a step: each finished prefill's KV goes to the decode
    /// replica that queued it (one that failed is prefilled there), and it pulls again.
    fn finish_prefill_step(&mut self, i: usize, t: f64) {
        self.replicas[i].step_end = None;
        let mut outputs = std::mem::take(&mut self.outputs);
        outputs.clear();
        self.replicas[i].worker.finish_step(&mut outputs);
        for out in &outputs {
            let index = out.request as usize;
            let Some(stream) = self.streams.get_mut(&index) else { continue };
            // The prefill's one token is not sent: the decode replica's first is.
            stream.prefilled |= out.token;
            if !out.finished {
                continue;
            }
            if stream.prefilled {
                let replica = stream.replica;
                self.start_transfer(index, i, replica, t);
            } else {
                stream.prefill_replica = None;
                self.prefill_locally(index, t);
            }
        }
        self.outputs = outputs;
        self.start_step(i, t);
        self.retire_if_drained(i);
        self.pull_prefills(t);
    }

    fn finish_step(&mut self, i: usize, t: f64) {
        let role = self.replicas[i].role;
        let Some(p) = self.pool(role) else {
            self.finish_prefill_step(i, t);
            return;
        };
        self.replicas[i].step_end = None;
        let mut outputs = std::mem::take(&mut self.outputs);
        outputs.clear();
        self.replicas[i].worker.finish_step(&mut outputs);
        let draining = self.replicas[i].state == ReplicaState::Draining;
        let now = self.at(t);
        for out in &outputs {
            let index = out.request as usize;
            let Some(stream) = self.streams.get_mut(&index) else { continue };
            if out.token {
                stream.first.get_or_insert(t);
                stream.last = Some(t);
                stream.tokens += 1;
                // The selector times the stream (TTFT, time per item) on the lab's clock,
                // as the frontend times its streams.
                if let Some(load) = stream.pick.as_mut().and_then(|pick| pick.load.as_mut()) {
                    load.observe_item_at(now);
                }
            }
            if out.finished {
                let Some(stream) = self.streams.remove(&index) else { continue };
                let arrival = self.arrival_ms[index];
                let failed = stream.first.is_none();
                if failed && draining {
                    self.window.failed_at_scale_down += 1;
                }
                let itl = match (stream.first, stream.last) {
                    (Some(first), Some(last)) if stream.tokens >= 2 => Some((last - first) / f64::from(stream.tokens - 1)),
                    _ => None,
                };
                self.window.finished.push(FinishedRequest {
                    index,
                    arrival_s: arrival / 1000.0,
                    ttft_ms: stream.first.map(|first| first - arrival),
                    itl_ms: itl,
                    input_length: self.requests[index].input_length,
                    replica: stream.replica,
                    prefill_replica: stream.prefill_replica,
                });
                let outcome = if failed { Outcome::Failed } else { Outcome::Completed };
                if let Some(pick) = stream.pick {
                    self.pools[p].selector.set_clock(now);
                    self.pools[p].selector.on_end(pick, outcome);
                }
            }
        }
        self.outputs = outputs;
        self.start_step(i, t);
        self.report_load(i, t);
        self.retire_if_drained(i);
        if !self.pools[p].queue.is_empty() && self.config.busy_threshold.is_some() {
            // A replica may have left the busy threshold: the queue can move.
            self.dispatch_queue(role, t);
        }
    }

    /// Run the simulation up to `until_s` and return what happened since the last call.
    /// A time in the past leaves the clock where it is.
    pub fn advance(&mut self, until_s: f64) -> Result<WindowStats, LabError> {
        let until = (until_s * 1000.0).max(self.now_ms);
        let entry = self.config.entry();
        loop {
            let arrival = self.order.get(self.next).map(|&i| self.arrival_ms[i]);
            let ready = self
                .replicas
                .iter()
                .enumerate()
                .filter(|(_, r)| r.state == ReplicaState::Starting)
                .map(|(i, r)| (i, r.ready_ms))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let step = self
                .replicas
                .iter()
                .enumerate()
                .filter_map(|(i, r)| r.step_end.map(|t| (i, t)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let transfer = self.transfers.iter().enumerate().map(|(k, tr)| (k, tr.end_ms)).min_by(|a, b| a.1.total_cmp(&b.1));
            let expiry = self.remote_deadline();
            let refusal = self.hold_deadline();
            // At equal times: a replica becomes ready, then a step ends, then a transfer
            // lands, then a remote prefill is given up, then a held request is refused,
            // then a request arrives.
            let earliest = [ready.map(|r| r.1), step.map(|s| s.1), transfer.map(|x| x.1), expiry, refusal, arrival]
                .into_iter()
                .flatten()
                .fold(f64::INFINITY, f64::min);
            if earliest > until {
                break;
            }
            self.now_ms = earliest;
            match (ready, step, transfer) {
                (Some((i, t)), _, _) if t == earliest => {
                    self.replicas[i].state = ReplicaState::Ready;
                    let role = self.replicas[i].role;
                    self.serve_queue(role, t);
                }
                (_, Some((i, t)), _) if t == earliest => {
                    self.finish_step(i, t);
                    // Requests an engine cannot schedule now and never will (cannot happen
                    // with prompts that fit; guards the loop).
                    if let Some(r) = self.replicas.iter().find(|r| r.step_end.is_none() && r.worker.requests() > 0) {
                        return Err(LabError::Invalid(format!("replica {} is stuck with {} requests", r.id, r.worker.requests())));
                    }
                }
                (_, _, Some((k, t))) if t == earliest => self.land(k, t),
                _ if expiry == Some(earliest) => self.expire_prefill(earliest),
                _ if refusal == Some(earliest) => self.refuse_held(earliest),
                _ => {
                    let index = self.order[self.next];
                    self.next += 1;
                    self.window.arrivals += 1;
                    self.window.arrival_input_tokens += self.requests[index].input_length as u64;
                    let Some(p) = self.pool(entry) else { continue };
                    if !self.pools[p].queue.is_empty() || !self.dispatch(entry, index, earliest) {
                        self.pools[p].queue.push_back(index);
                    }
                }
            }
        }
        self.now_ms = until;
        let mut window = std::mem::take(&mut self.window);
        window.end_s = until / 1000.0;
        window.frontend_queue = self.pool(entry).map_or(0, |p| self.pools[p].queue.len());
        window.prefill_queue = self.prefill_queue.len();
        window.transferring = self.transfers.len();
        window.inflight = self.streams.len() + window.frontend_queue;
        window.replicas = self
            .replicas
            .iter()
            .map(|r| {
                let m = r.worker.metrics();
                ReplicaLoad {
                    id: r.id,
                    role: r.role,
                    state: r.state,
                    ready_s: (r.state != ReplicaState::Starting).then_some(r.ready_ms / 1000.0),
                    running: m.request_active_slots,
                    waiting: m.num_requests_waiting,
                    kv_active_blocks: m.kv_active_blocks,
                }
            })
            .collect();
        window.replica_seconds = self.replica_seconds();
        window.role_seconds = self.roles().iter().map(|&r| (r, self.role_seconds(r))).collect();
        self.window.start_s = window.end_s;
        Ok(window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab_trace::percentile;

    fn steady(rate_per_s: f64, seconds: f64, isl: usize, osl: usize) -> Vec<TraceRequest> {
        let n = (rate_per_s * seconds) as usize;
        (0..n)
            .map(|i| TraceRequest {
                timestamp: i as f64 * 1000.0 / rate_per_s,
                input_length: isl,
                output_length: osl,
                hash_ids: Vec::new(),
            })
            .collect()
    }

    fn config(replicas: usize) -> PlannerLabConfig {
        PlannerLabConfig {
            replicas,
            engine: MockerArgs { block_size: 16, num_gpu_blocks: 4096, ..Default::default() },
            startup_s: 5.0,
            warmup_s: 2.0,
            warmup_factor: 3.0,
            ..Default::default()
        }
    }

    fn run_to_end(lab: &mut PlannerLab, step_s: f64) -> Vec<WindowStats> {
        let mut windows = Vec::new();
        let mut t = 0.0;
        while !lab.done() {
            t += step_s;
            windows.push(lab.advance(t).unwrap());
            assert!(t < 10_000.0, "the replay does not end");
        }
        windows
    }

    #[test]
    fn the_same_calls_give_the_same_windows() {
        let trace = steady(4.0, 20.0, 300, 30);
        let play = || {
            let mut lab = PlannerLab::new(trace.clone(), config(1)).unwrap();
            let mut windows = vec![lab.advance(5.0).unwrap()];
            lab.set_replicas(3).unwrap();
            windows.extend(run_to_end(&mut lab, 2.5));
            windows
        };
        let a = play();
        assert_eq!(a, play());
        let finished: usize = a.iter().map(|w| w.finished.len()).sum();
        assert_eq!(finished, trace.len());
        assert_eq!(a.iter().map(|w| w.arrivals).sum::<usize>(), trace.len());
        assert!(a.iter().flat_map(|w| &w.finished).all(|f| f.ttft_ms.is_some_and(|t| t > 0.0) && f.itl_ms.is_some()));
    }

    #[test]
    fn a_new_replica_is_ready_after_the_startup_delay_and_warms_up_slowly() {
        // One request at a time, each alone on its replica: its TTFT is one prefill.
        let trace: Vec<TraceRequest> = (0..8)
            .map(|i| TraceRequest { timestamp: i as f64 * 2000.0, input_length: 2000, output_length: 4, hash_ids: vec![] })
            .collect();
        let mut lab = PlannerLab::new(trace, PlannerLabConfig { replicas: 0, ..config(0) }).unwrap();
        lab.set_replicas(1).unwrap();
        assert_eq!(lab.counts(), (1, 0, 0));
        let w = lab.advance(4.99).unwrap();
        assert_eq!((w.arrivals, w.frontend_queue, w.finished.len()), (3, 3, 0), "nothing is served while it starts");
        assert_eq!(w.replicas[0].state, ReplicaState::Starting);
        let w = lab.advance(5.0).unwrap();
        assert_eq!(w.replicas[0].ready_s, Some(5.0));
        let windows = run_to_end(&mut lab, 1.0);
        let done: Vec<&FinishedRequest> = windows.iter().flat_map(|w| &w.finished).collect();
        // Queued since 0 s: waited for the start-up.
        assert!(done[0].ttft_ms.unwrap() >= 5000.0);
        // During warm-up (ready 5 s to 7 s) a lone prefill is `warmup_factor` slower than after.
        let alone = |at: f64| done.iter().find(|f| f.arrival_s == at).unwrap().ttft_ms.unwrap();
        let (warm_up, warm) = (alone(6.0), alone(14.0));
        assert!((warm_up / warm - 3.0).abs() < 0.05, "warm-up {warm_up} ms vs warm {warm} ms");
    }

    #[test]
    fn scale_down_drains_without_failures_and_costs_until_drained() {
        let trace = steady(20.0, 10.0, 500, 200);
        let mut lab = PlannerLab::new(trace.clone(), config(4)).unwrap();
        let w = lab.advance(10.0).unwrap();
        assert!(w.inflight > 8, "requests in flight when scaling down ({})", w.inflight);
        lab.set_replicas(1).unwrap();
        assert_eq!(lab.counts().1, 1);
        let draining = lab.counts().2;
        assert!(draining >= 1, "busy replicas drain");
        let windows = run_to_end(&mut lab, 0.5);
        let all: Vec<&FinishedRequest> = std::iter::once(&w).chain(&windows).flat_map(|w| &w.finished).collect();
        assert_eq!(all.len(), trace.len());
        assert!(all.iter().all(|f| f.ttft_ms.is_some()), "every request produced tokens");
        assert_eq!(windows.iter().map(|w| w.failed_at_scale_down + w.rejected).sum::<usize>(), 0);
        // After the drain only one replica remains, and drained ones took nothing new.
        assert_eq!(lab.counts(), (0, 1, 0));
        let kept = windows.last().unwrap().replicas[0].id;
        assert!(windows.iter().flat_map(|w| &w.finished).filter(|f| f.arrival_s > 10.0).all(|f| f.replica == kept));
    }

    #[test]
    fn gpu_seconds_count_from_the_request_until_gone() {
        let mut lab = PlannerLab::new(Vec::new(), config(2)).unwrap();
        lab.advance(10.0).unwrap();
        assert!((lab.replica_seconds() - 20.0).abs() < 1e-9);
        lab.set_replicas(3).unwrap(); // starting at 10 s, ready at 15 s
        lab.advance(12.0).unwrap();
        lab.set_replicas(2).unwrap(); // the starting one goes first: it cost 2 s
        assert_eq!(lab.counts(), (0, 2, 0));
        lab.set_replicas(1).unwrap(); // an idle ready one goes at once
        let w = lab.advance(20.0).unwrap();
        // The one kept: 20 s; the one removed at 12 s: 12 s; the one that never started: 2 s.
        assert!((w.replica_seconds - (20.0 + 12.0 + 2.0)).abs() < 1e-9, "{}", w.replica_seconds);
        assert_eq!(w.replicas.len(), 1);
    }

    #[test]
    fn with_a_busy_threshold_a_backlog_waits_at_the_frontend_for_any_replica() {
        // 40 requests at once on one replica; a second is asked for at once, ready at 5 s.
        let burst: Vec<TraceRequest> = (0..40)
            .map(|i| TraceRequest { timestamp: f64::from(i), input_length: 2000, output_length: 100, hash_ids: vec![] })
            .collect();
        let play = |busy_threshold: Option<f64>| {
            let mut lab = PlannerLab::new(burst.clone(), PlannerLabConfig { busy_threshold, ..config(1) }).unwrap();
            let first = lab.advance(0.5).unwrap();
            lab.set_replicas(2).unwrap();
            let windows = run_to_end(&mut lab, 0.5);
            let done: Vec<FinishedRequest> = std::iter::once(first).chain(windows).flat_map(|w| w.finished).collect();
            assert_eq!(done.len(), burst.len());
            assert!(done.iter().all(|f| f.ttft_ms.is_some()));
            done.iter().filter(|f| f.replica == 1).count()
        };
        // Without it the first replica took them all into its engine queue.
        assert_eq!(play(None), 0);
        // With it the first replica filled up to the threshold and the rest waited for the new one.
        let on_new = play(Some(0.05));
        assert!(on_new >= 10, "{on_new} of 40 went to the new replica");
        let err = PlannerLab::new(Vec::new(), PlannerLabConfig { busy_threshold: Some(0.0), ..config(1) }).unwrap_err();
        assert!(err.to_string().contains("busy threshold"), "{err}");
    }

    #[test]
    fn with_a_busy_wait_a_request_held_past_it_is_refused() {
        // 40 requests in the first 40 ms on one replica that holds a few at the threshold.
        let burst: Vec<TraceRequest> = (0..40)
            .map(|i| TraceRequest { timestamp: f64::from(i), input_length: 2000, output_length: 100, hash_ids: vec![] })
            .collect();
        let held = PlannerLabConfig { busy_threshold: Some(0.05), busy_wait_s: Some(1.0), ..config(1) };
        let mut lab = PlannerLab::new(burst.clone(), held).unwrap();
        // Nothing is refused before it has waited a second.
        let before = lab.advance(0.99).unwrap();
        assert_eq!(before.rejected, 0);
        assert!(before.frontend_queue > 0, "nothing was held");
        let windows = run_to_end(&mut lab, 0.5);
        let refused: usize = windows.iter().map(|w| w.rejected).sum();
        let done: Vec<FinishedRequest> = std::iter::once(before).chain(windows).flat_map(|w| w.finished).collect();
        // Every request was either served or refused, and some of each.
        assert_eq!(done.len() + refused, burst.len());
        assert!(refused > 0 && !done.is_empty(), "{refused} refused, {} served", done.len());
        assert!(done.iter().all(|f| f.ttft_ms.is_some()));
        // Without a bound the same burst is all served.
        let unbounded = PlannerLabConfig { busy_threshold: Some(0.05), ..config(1) };
        let mut lab = PlannerLab::new(burst.clone(), unbounded).unwrap();
        let windows = run_to_end(&mut lab, 0.5);
        assert_eq!(windows.iter().map(|w| w.rejected).sum::<usize>(), 0);
        assert_eq!(windows.iter().map(|w| w.finished.len()).sum::<usize>(), burst.len());
        for (wait, threshold, needs) in [(Some(0.0), Some(0.5), "> 0 seconds"), (Some(1.0), None, "busy threshold")] {
            let config = PlannerLabConfig { busy_threshold: threshold, busy_wait_s: wait, ..config(1) };
            let err = PlannerLab::new(Vec::new(), config).unwrap_err();
            assert!(err.to_string().contains(needs), "{err}");
        }
    }

    #[test]
    fn the_selector_times_the_streams_on_the_labs_clock() {
        // As the frontend times its streams: the router's per-replica TTFT and time per
        // token are the lab's own, on its clock (not the wall clock the replay runs on).
        let trace = steady(4.0, 30.0, 2000, 30);
        let mut lab = PlannerLab::new(trace.clone(), config(2)).unwrap();
        let windows = run_to_end(&mut lab, 5.0);
        let done: Vec<&FinishedRequest> = windows.iter().flat_map(|w| &w.finished).collect();
        assert_eq!(done.len(), trace.len());
        let mean = |v: Vec<f64>| v.iter().sum::<f64>() / v.len() as f64;
        let ttft_s = mean(done.iter().filter_map(|f| f.ttft_ms).collect()) / 1000.0;
        let itl_s = mean(done.iter().filter_map(|f| f.itl_ms).collect()) / 1000.0;
        for id in [0, 1] {
            let timing = lab.pools[0].router.load().lock().timing(id).expect("timed streams");
            assert!(timing.samples > 10, "{timing:?}");
            assert!(timing.ttft_s > ttft_s / 3.0 && timing.ttft_s < ttft_s * 3.0, "{timing:?} vs {ttft_s} s");
            assert!(timing.tpot_s > itl_s / 3.0 && timing.tpot_s < itl_s * 3.0, "{timing:?} vs {itl_s} s");
        }
    }

    fn disagg(prefill_replicas: usize, decode_replicas: usize) -> PlannerLabConfig {
        PlannerLabConfig { replicas: 0, disagg: Some(DisaggPools::new(prefill_replicas, decode_replicas)), ..config(0) }
    }

    /// Disaggregated pools whose decode replicas run with `settings`.
    fn disagg_with(prefill_replicas: usize, decode_replicas: usize, settings: DisaggConfig) -> PlannerLabConfig {
        PlannerLabConfig {
            disagg: Some(DisaggPools { prefill_replicas, decode_replicas, settings }),
            ..disagg(prefill_replicas, decode_replicas)
        }
    }

    /// Every prefill remote, however long the queue (as the lab was before conditional
    /// disaggregation).
    fn always_remote() -> DisaggConfig {
        DisaggConfig { max_local_prefill_length: 0, max_prefill_queue_size: usize::MAX, ..Default::default() }
    }

    fn request(at_ms: f64, input_length: usize, output_length: usize) -> TraceRequest {
        TraceRequest { timestamp: at_ms, input_length, output_length, hash_ids: vec![] }
    }

    /// The finished requests by index.
    fn by_index(windows: &[WindowStats]) -> FxHashMap<usize, &FinishedRequest> {
        all_finished(windows).into_iter().map(|f| (f.index, f)).collect()
    }

    fn all_finished(windows: &[WindowStats]) -> Vec<&FinishedRequest> {
        windows.iter().flat_map(|w| &w.finished).collect()
    }

    fn p90(values: impl Iterator<Item = f64>) -> f64 {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.9)
    }

    #[test]
    fn disaggregated_pools_serve_every_request_the_same_way_twice() {
        let trace = steady(4.0, 20.0, 2000, 30);
        let play = || {
            let mut lab = PlannerLab::new(trace.clone(), disagg(1, 1)).unwrap();
            let mut windows = vec![lab.advance(5.0).unwrap()];
            lab.set_role_replicas(DisaggRole::Prefill, 2).unwrap();
            lab.set_role_replicas(DisaggRole::Decode, 3).unwrap();
            assert_eq!((lab.role_counts(DisaggRole::Prefill), lab.role_counts(DisaggRole::Decode)), ((1, 1, 0), (2, 1, 0)));
            windows.extend(run_to_end(&mut lab, 2.5));
            windows
        };
        let a = play();
        assert_eq!(a, play());
        let done = all_finished(&a);
        assert_eq!(done.len(), trace.len());
        let roles: FxHashMap<u64, DisaggRole> = a.iter().flat_map(|w| &w.replicas).map(|r| (r.id, r.role)).collect();
        for f in &done {
            assert!(f.ttft_ms.is_some_and(|t| t > 0.0) && f.itl_ms.is_some(), "{f:?}");
            assert!(f.prefill_replica.is_none_or(|p| roles[&p] == DisaggRole::Prefill), "{f:?}");
            assert_eq!(roles[&f.replica], DisaggRole::Decode);
        }
        // Prompts of 2,000 tokens, longer than the 1,000 a decode replica prefills itself.
        let remote = done.iter().filter(|f| f.prefill_replica.is_some()).count();
        assert!(remote > done.len() / 2, "{remote} of {} prefilled remotely", done.len());
        assert_eq!(a.iter().map(|w| w.remote_prefills).sum::<usize>(), remote);
        assert!(done.iter().any(|f| f.replica >= 3), "a decode replica added later serves");
        let last = a.last().unwrap();
        let by_role: f64 = last.role_seconds.iter().map(|(_, s)| s).sum();
        assert!((by_role - last.replica_seconds).abs() < 1e-9);
        assert_eq!(last.role_seconds.iter().map(|(r, _)| *r).collect::<Vec<_>>(), vec![DisaggRole::Prefill, DisaggRole::Decode]);
    }

    #[test]
    fn a_disaggregated_ttft_is_the_prefill_the_transfer_and_the_first_decode_step() {
        // One request alone: its TTFT is a prefill on one engine, the KV transfer, and
        // the step of another engine that holds the prompt's full blocks as cached.
        let request = TraceRequest { timestamp: 0.0, input_length: 2000, output_length: 4, hash_ids: vec![] };
        let engine = MockerArgs { kv_transfer_gbps: 1.0, ..config(0).engine };
        let tokens = synthesize_tokens(&request, 0, DEFAULT_TRACE_BLOCK_SIZE);
        let mut prefill = SimWorker::new(engine.clone(), 1.0).unwrap();
        prefill.add(0, tokens.clone(), 1).unwrap();
        let prefill_ms = prefill.start_step().unwrap();
        let transfer_ms = engine.transfer_seconds(2000 / 16) * 1000.0;
        assert!(transfer_ms > 200.0, "{transfer_ms}");
        let mut decode = SimWorker::new(engine.clone(), 1.0).unwrap();
        decode.import_kv(&tokens);
        decode.add(0, tokens, 4).unwrap();
        let first_step_ms = decode.start_step().unwrap();

        let mut lab = PlannerLab::new(vec![request], PlannerLabConfig { engine, ..disagg(1, 1) }).unwrap();
        let done = run_to_end(&mut lab, 1.0);
        let f = all_finished(&done)[0].clone();
        let expected = prefill_ms + transfer_ms + first_step_ms;
        assert!((f.ttft_ms.unwrap() - expected).abs() < 1e-6, "{:?} vs {expected}", f.ttft_ms);
        assert!(first_step_ms < prefill_ms / 5.0, "the decode recomputes only the prompt's tail");
        assert_eq!((f.prefill_replica, f.replica), (Some(0), 1));
    }

    #[test]
    fn transfers_into_one_decode_replica_share_its_link() {
        // Two prompts prefilled side by side on two prefill replicas: their KV goes to the
        // one decode replica at once, each at half the link, so both land after twice a
        // lone transfer's time.
        let engine = MockerArgs { kv_transfer_gbps: 1.0, ..config(0).engine };
        let trace = vec![request(0.0, 2000, 4), request(0.0, 2000, 4)];
        let tokens = synthesize_tokens(&trace[0], 0, DEFAULT_TRACE_BLOCK_SIZE);
        let mut prefill = SimWorker::new(engine.clone(), 1.0).unwrap();
        prefill.add(0, tokens.clone(), 1).unwrap();
        let prefill_ms = prefill.start_step().unwrap();
        let transfer_ms = engine.transfer_seconds(2000 / 16) * 1000.0;
        let mut decode = SimWorker::new(engine.clone(), 1.0).unwrap();
        decode.import_kv(&tokens);
        decode.add(0, tokens, 4).unwrap();
        let first_step_ms = decode.start_step().unwrap();

        let mut lab = PlannerLab::new(trace, PlannerLabConfig { engine, ..disagg(2, 1) }).unwrap();
        let windows = run_to_end(&mut lab, 1.0);
        let done = by_index(&windows);
        assert_eq!((done[&0].prefill_replica, done[&1].prefill_replica), (Some(0), Some(1)));
        let expected = prefill_ms + 2.0 * transfer_ms + first_step_ms;
        assert!((done[&0].ttft_ms.unwrap() - expected).abs() < 1e-6, "{:?} vs {expected}", done[&0].ttft_ms);
        assert!(done[&1].ttft_ms.unwrap() > expected);
    }

    #[test]
    fn draining_either_pool_loses_nothing() {
        let trace = steady(20.0, 10.0, 1500, 200);
        let mut lab = PlannerLab::new(trace.clone(), disagg(3, 3)).unwrap();
        let w = lab.advance(5.0).unwrap();
        assert!(w.inflight > 8, "requests in flight when scaling down ({})", w.inflight);
        lab.set_role_replicas(DisaggRole::Prefill, 1).unwrap();
        lab.set_role_replicas(DisaggRole::Decode, 1).unwrap();
        assert_eq!((lab.role_counts(DisaggRole::Prefill).1, lab.role_counts(DisaggRole::Decode).1), (1, 1));
        assert!(lab.role_counts(DisaggRole::Decode).2 >= 1, "busy decode replicas drain");
        let windows = run_to_end(&mut lab, 0.5);
        let all: Vec<&FinishedRequest> = std::iter::once(&w).chain(&windows).flat_map(|w| &w.finished).collect();
        assert_eq!(all.len(), trace.len());
        assert!(all.iter().all(|f| f.ttft_ms.is_some()), "every request produced tokens");
        assert_eq!(windows.iter().map(|w| w.failed_at_scale_down + w.rejected).sum::<usize>(), 0);
        assert_eq!((lab.role_counts(DisaggRole::Prefill), lab.role_counts(DisaggRole::Decode)), ((0, 1, 0), (0, 1, 0)));
        // Nothing sent after the resize went to a removed replica.
        let kept: Vec<u64> = windows.last().unwrap().replicas.iter().map(|r| r.id).collect();
        let late = windows.iter().flat_map(|w| &w.finished).filter(|f| f.arrival_s > 6.0);
        assert!(late.clone().count() > 50);
        assert!(late.clone().all(|f| kept.contains(&f.replica) && f.prefill_replica.is_none_or(|p| kept.contains(&p))));
        assert!(late.clone().any(|f| f.prefill_replica.is_some()) && late.clone().any(|f| f.prefill_replica.is_none()));
        // Remote prefills queued before the resize landed on the draining decode replicas.
        let drained: Vec<u64> = w.replicas.iter().filter(|r| !kept.contains(&r.id)).map(|r| r.id).collect();
        assert!(all.iter().any(|f| f.prefill_replica.is_some() && f.arrival_s <= 5.0 && drained.contains(&f.replica)));
    }

    #[test]
    fn a_small_prefill_pool_shows_in_ttft_and_a_small_decode_pool_in_itl() {
        // Every prefill remote: what each pool's size does, without decode replicas
        // taking the prefills a short queue would send back to them.
        let play = |trace: &[TraceRequest], prefill: usize, decode: usize| {
            let mut lab = PlannerLab::new(trace.to_vec(), disagg_with(prefill, decode, always_remote())).unwrap();
            let windows = run_to_end(&mut lab, 1.0);
            let done = all_finished(&windows);
            assert_eq!(done.len(), trace.len());
            (p90(done.iter().filter_map(|f| f.ttft_ms)), p90(done.iter().filter_map(|f| f.itl_ms)))
        };
        // Long prompts, short answers: one prefill replica cannot keep up.
        let prompts = steady(8.0, 15.0, 4000, 20);
        let (few, enough) = (play(&prompts, 1, 4), play(&prompts, 4, 4));
        assert!(few.0 > 3.0 * enough.0, "TTFT p90 {} ms with 1 prefill replica vs {} ms with 4", few.0, enough.0);
        assert!(few.1 < 1.5 * enough.1, "ITL p90 {} ms vs {} ms", few.1, enough.1);
        // Short prompts, long answers: one decode replica batches them all, and slows.
        let answers = steady(20.0, 15.0, 1000, 300);
        let (few, enough) = (play(&answers, 4, 1), play(&answers, 4, 4));
        assert!(few.1 > 1.5 * enough.1, "ITL p90 {} ms with 1 decode replica vs {} ms with 4", few.1, enough.1);
    }

    #[test]
    fn a_short_prompt_is_prefilled_by_its_decode_replica_and_a_long_one_remotely() {
        let trace = vec![request(0.0, 800, 4), request(2000.0, 2000, 4)];
        let mut lab = PlannerLab::new(trace, disagg(1, 1)).unwrap();
        let w = lab.advance(1.0).unwrap();
        assert_eq!((w.local_prefills, w.remote_prefills, w.finished.len()), (1, 0, 1));
        let short = &w.finished[0];
        assert_eq!((short.prefill_replica, short.replica), (None, 1));
        // The prefill replica was not touched: nothing in its cache, no step taken.
        let prefill = w.replicas.iter().find(|r| r.role == DisaggRole::Prefill).unwrap();
        assert_eq!((prefill.kv_active_blocks, prefill.running, prefill.waiting), (0, 0, 0));
        assert_eq!(lab.replicas[0].worker.prefix_blocks(), (0, 0), "the prefill engine admitted nothing");
        let w = lab.advance(5.0).unwrap();
        assert_eq!((w.local_prefills, w.remote_prefills, w.finished.len()), (0, 1, 1));
        assert_eq!((w.finished[0].prefill_replica, w.finished[0].replica), (Some(0), 1));
    }

    #[test]
    fn a_full_prefill_queue_keeps_the_next_long_prompt_local() {
        // One prefill replica, one job at a time; one job may wait in the queue.
        let settings = DisaggConfig { max_prefill_queue_size: 1, max_concurrent_prefills: 1, ..Default::default() };
        let trace: Vec<TraceRequest> = (0..4).map(|i| request(f64::from(i), 4000, 4)).collect();
        let mut lab = PlannerLab::new(trace, disagg_with(1, 1, settings)).unwrap();
        let w = lab.advance(0.002).unwrap();
        // 0 pulled at once, 1 queued (the queue was empty), 2 kept local (the queue full).
        assert_eq!((w.remote_prefills, w.local_prefills, w.prefill_queue), (2, 1, 1));
        let windows = run_to_end(&mut lab, 1.0);
        let done = by_index(&windows);
        let prefilled_by: Vec<Option<u64>> = (0..4).map(|i| done[&i].prefill_replica).collect();
        // 3 arrived while 1 still waited: local too.
        assert_eq!(prefilled_by, vec![Some(0), Some(0), None, None]);
    }

    #[test]
    fn a_prompt_its_decode_replica_holds_is_prefilled_there() {
        let shared = |at_ms: f64| TraceRequest { timestamp: at_ms, input_length: 2048, output_length: 4, hash_ids: vec![1, 2, 3, 4] };
        let mut lab = PlannerLab::new(vec![shared(0.0), shared(3000.0)], disagg(1, 1)).unwrap();
        let done = run_to_end(&mut lab, 1.0);
        let done = by_index(&done);
        // The first one's KV was handed to the decode replica, which caches it: the
        // second's uncached part is empty, not above the local prefill length.
        assert_eq!((done[&0].prefill_replica, done[&1].prefill_replica), (Some(0), None));
        assert!(done[&1].ttft_ms.unwrap() < done[&0].ttft_ms.unwrap() / 3.0, "{:?} {:?}", done[&1].ttft_ms, done[&0].ttft_ms);
    }

    #[test]
    fn the_prefill_queue_is_one_fifo_that_idle_prefill_replicas_pull_from() {
        // Two prefill replicas, one job each at a time: 0 goes to replica 0, 1 (short) to
        // replica 1; 2 and 3 wait. Replica 1 frees first and takes the oldest (2, long),
        // then replica 0 frees and takes 3.
        let settings = DisaggConfig { max_concurrent_prefills: 1, ..always_remote() };
        let trace = vec![request(0.0, 6000, 4), request(1.0, 2000, 4), request(2.0, 8000, 4), request(3.0, 2000, 4)];
        let mut lab = PlannerLab::new(trace, disagg_with(2, 1, settings)).unwrap();
        let w = lab.advance(0.01).unwrap();
        assert_eq!((w.remote_prefills, w.prefill_queue), (4, 2));
        let windows = run_to_end(&mut lab, 1.0);
        let done = by_index(&windows);
        let prefilled_by: Vec<Option<u64>> = (0..4).map(|i| done[&i].prefill_replica).collect();
        assert_eq!(prefilled_by, vec![Some(0), Some(1), Some(1), Some(0)]);
        assert!(windows.iter().all(|w| w.local_prefills == 0));
    }

    #[test]
    fn a_queued_prefill_nobody_pulls_is_prefilled_by_its_decode_replica_after_the_timeout() {
        let settings = DisaggConfig { max_concurrent_prefills: 1, remote_prefill_timeout: Duration::from_secs(2), ..always_remote() };
        let trace: Vec<TraceRequest> = (0..3).map(|i| request(f64::from(i), 4000, 4)).collect();
        let mut lab = PlannerLab::new(trace, disagg_with(1, 1, settings)).unwrap();
        let w = lab.advance(0.01).unwrap();
        assert_eq!(w.prefill_queue, 2);
        // The prefill pool goes: its replica drains its one job and pulls no more.
        lab.set_role_replicas(DisaggRole::Prefill, 0).unwrap();
        let windows = run_to_end(&mut lab, 0.5);
        let done = by_index(&windows);
        assert_eq!(done[&0].prefill_replica, Some(0));
        for i in [1, 2] {
            assert_eq!(done[&i].prefill_replica, None);
            assert!(done[&i].ttft_ms.unwrap() >= 2000.0 - 2.0, "{:?}", done[&i].ttft_ms);
        }
        assert_eq!(windows.iter().map(|w| w.local_prefills).sum::<usize>(), 2);
        assert_eq!(windows.iter().map(|w| w.fallback_prefills).sum::<usize>(), 2);
        assert_eq!(lab.role_counts(DisaggRole::Prefill), (0, 0, 0));
    }

    /// Milliseconds a lone engine with `engine` takes to prefill `request`'s prompt (to
    /// its first token).
    fn prefill_alone_ms(engine: &MockerArgs, request: &TraceRequest) -> f64 {
        let mut worker = SimWorker::new(engine.clone(), 1.0).unwrap();
        worker.add(0, synthesize_tokens(request, 0, DEFAULT_TRACE_BLOCK_SIZE), 1).unwrap();
        let (mut ms, mut out) = (0.0, Vec::new());
        while let Some(step) = worker.start_step() {
            ms += step;
            worker.finish_step(&mut out);
        }
        ms
    }

    #[test]
    fn a_prefill_under_way_past_the_timeout_is_given_up_and_its_slot_freed() {
        // A prompt whose prefill takes twice the timeout: the decode replica gives it up
        // at the deadline (the prefill replica drops it after the step under way, one
        // short chunk) and prefills it itself; the prefill replica's one slot then takes
        // the next job, which lands in time.
        let engine = MockerArgs { max_num_batched_tokens: 1024, ..config(0).engine };
        let long = request(0.0, 16_000, 4);
        let timeout_ms = prefill_alone_ms(&engine, &long) / 2.0;
        let short = request(0.9 * timeout_ms, 1500, 4);
        let short_ms = prefill_alone_ms(&engine, &short) + engine.transfer_seconds(1500 / 16) * 1000.0;
        assert!(short_ms < 0.3 * timeout_ms, "{short_ms} vs {timeout_ms}");
        let settings = DisaggConfig {
            max_concurrent_prefills: 1,
            remote_prefill_timeout: Duration::from_secs_f64(timeout_ms / 1000.0),
            ..always_remote()
        };
        let lab_config = PlannerLabConfig { engine: engine.clone(), ..disagg_with(1, 1, settings) };
        let mut lab = PlannerLab::new(vec![long.clone(), short], lab_config).unwrap();
        let w = lab.advance(timeout_ms / 1000.0 - 0.001).unwrap();
        assert_eq!((w.remote_prefills, w.prefill_queue, w.fallback_prefills), (2, 1, 0));
        let w = lab.advance(timeout_ms / 1000.0 + 0.001).unwrap();
        assert_eq!((w.fallback_prefills, w.local_prefills, w.prefill_queue), (1, 1, 0));
        let prefill = w.replicas.iter().find(|r| r.role == DisaggRole::Prefill).unwrap();
        assert_eq!(prefill.running + prefill.waiting, 1, "the long job left; the short one is in");
        let windows = run_to_end(&mut lab, 1.0);
        let done = by_index(&windows);
        assert_eq!((done[&0].prefill_replica, done[&1].prefill_replica), (None, Some(0)));
        let local_ms = prefill_alone_ms(&engine, &long);
        assert!(done[&0].ttft_ms.unwrap() >= timeout_ms + local_ms - 1e-6, "{:?}", done[&0].ttft_ms);
        assert!(windows.iter().all(|w| w.fallback_prefills == 0));
        let last = windows.last().unwrap();
        assert!(last.replicas.iter().all(|r| r.kv_active_blocks == 0 && r.running + r.waiting == 0));
    }

    #[test]
    fn a_kv_transfer_past_the_timeout_is_given_up() {
        // A slow link: the prompt's KV would land after the deadline, so the transfer
        // stops there and the decode replica prefills the prompt itself.
        let engine = MockerArgs { kv_transfer_gbps: 0.05, ..config(0).engine };
        let prompt = request(0.0, 4000, 4);
        let prefill_ms = prefill_alone_ms(&engine, &prompt);
        let transfer_ms = engine.transfer_seconds(4000 / 16) * 1000.0;
        assert!(transfer_ms > prefill_ms, "{transfer_ms} vs {prefill_ms}");
        let timeout_ms = prefill_ms + transfer_ms / 2.0;
        let settings = DisaggConfig { remote_prefill_timeout: Duration::from_secs_f64(timeout_ms / 1000.0), ..always_remote() };
        let mut lab = PlannerLab::new(vec![prompt.clone()], PlannerLabConfig { engine: engine.clone(), ..disagg_with(1, 1, settings) }).unwrap();
        let w = lab.advance((timeout_ms - 1.0) / 1000.0).unwrap();
        assert_eq!((w.transferring, w.fallback_prefills), (1, 0));
        let w = lab.advance((timeout_ms + 1.0) / 1000.0).unwrap();
        assert_eq!((w.transferring, w.fallback_prefills), (0, 1), "the transfer stopped at the deadline");
        let windows = run_to_end(&mut lab, 1.0);
        assert!(windows.iter().all(|w| w.fallback_prefills == 0 && w.transferring == 0));
        let done = all_finished(&windows);
        assert_eq!((done.len(), done[0].prefill_replica), (1, None));
        assert!(done[0].ttft_ms.unwrap() >= timeout_ms + prefill_ms - 1e-6, "{:?}", done[0].ttft_ms);
        assert!(done[0].ttft_ms.unwrap() < prefill_ms + transfer_ms + prefill_ms, "{:?}", done[0].ttft_ms);
    }

    #[test]
    fn roles_are_checked() {
        let mut lab = PlannerLab::new(Vec::new(), disagg(1, 1)).unwrap();
        assert!(lab.set_replicas(2).unwrap_err().to_string().contains("per role"));
        assert_eq!(lab.roles(), &[DisaggRole::Prefill, DisaggRole::Decode]);
        let mut agg = PlannerLab::new(Vec::new(), config(1)).unwrap();
        let err = agg.set_role_replicas(DisaggRole::Decode, 2).unwrap_err();
        assert!(err.to_string().contains("no decode pool"), "{err}");
        let err = PlannerLab::new(Vec::new(), PlannerLabConfig { replicas: 1, ..disagg(1, 1) }).unwrap_err();
        assert!(err.to_string().contains("replicas must be 0"), "{err}");
    }

    #[test]
    fn bad_settings_are_clear_errors() {
        let err = PlannerLab::new(Vec::new(), PlannerLabConfig { warmup_factor: 0.5, ..config(1) }).unwrap_err();
        assert!(err.to_string().contains("warm-up factor"), "{err}");
        let err = PlannerLab::new(Vec::new(), PlannerLabConfig { time_scale: 0.0, ..config(1) }).unwrap_err();
        assert!(err.to_string().contains("time scale"), "{err}");
    }
}

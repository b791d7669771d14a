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
//! replica with a backlog gets fewer new requests as it would behind the frontend.
//! With a busy threshold ([`PlannerLabConfig::busy_threshold`]) the frontend also holds
//! arrivals while every ready replica is busy, so a backlog waits where any replica,
//! a new one included, can take it, instead of in one replica's engine queue.
//!
//! **Disaggregated** ([`PlannerLabConfig::disagg`]): two pools, [`DisaggRole::Prefill`] and
//! [`DisaggRole::Decode`], each resized on its own ([`PlannerLab::set_role_replicas`]), each
//! with its own selector. A request goes to a ready prefill replica, which computes its
//! prompt as the mocker's `prefill_for_transfer` does (a one-token generation whose
//! token is not sent; the prompt's full blocks stay cached there). Its full blocks then
//! go to a ready decode replica picked by the decode pool's selector (prefilled requests
//! wait, in order, while none is ready or, with a busy threshold, every one is busy),
//! arriving after the mocker's transfer time (`blocks · block_size · kv_bytes_per_token`
//! at `kv_transfer_gbps`), where they are stored as cached (`receive_kv`) and the request
//! is added: the decode replica computes the prompt's uncached tail and emits the first
//! token, as the decode worker does. Every prefill is remote (the lab sizes the pools;
//! conditional disaggregation would move prefills between them). A request's TTFT thus
//! spans the frontend queue, its prefill, the wait for a decode replica, the transfer and
//! the decode replica's first step. A draining prefill replica finishes its prefills (and
//! hands them over), a draining decode replica the transfers under way to it and its
//! decodes.
//!
//! [`closed_loop_point`] (`point.rs`) measures one replica at a fixed concurrency: the
//! capacity profile the lab's planner uses, taken from the same simulated engine.
//! The same requests, configuration and calls give the same windows.

mod point;

pub use point::{closed_loop_point, PointStats};

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;

use crate::disagg::DisaggRole;
use crate::engines::mocker::{MockerArgs, SimOutput, SimWorker};
use crate::lab_trace::{synthesize_tokens, LabError, TraceRequest, DEFAULT_LAB_GPU_BLOCKS, DEFAULT_TRACE_BLOCK_SIZE};
use crate::kv_router::{KvRouter, KvRouterConfig, SchedulerConfig};
use crate::routing::{KvSelector, Outcome, Pick, Selector};

/// The pools of a disaggregated lab, at time 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisaggPools {
    /// Prefill replicas ready (and warm) at time 0; may be 0.
    pub prefill_replicas: usize,
    /// Decode replicas ready (and warm) at time 0; may be 0.
    pub decode_replicas: usize,
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
    /// With `disagg` it holds prefilled requests from busy decode replicas the same way.
    pub busy_threshold: Option<f64>,
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
        if self.disagg.is_some() && self.replicas != 0 {
            return invalid(format!("a disaggregated lab has no aggregated replicas: replicas must be 0, got {}", self.replicas));
        }
        self.engine.validate().map_err(|e| LabError::Invalid(format!("engine arguments: {e}")))
    }

    /// The pools, the one that takes arrivals first.
    fn roles(&self) -> &'static [DisaggRole] {
        if self.disagg.is_some() {
            &[DisaggRole::Prefill, DisaggRole::Decode]
        } else {
            &[DisaggRole::Agg]
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
    /// The replica that served it (disaggregated: the decode replica, or the prefill
    /// replica when it failed there).
    pub replica: u64,
    /// Disaggregated: the prefill replica that computed its prompt.
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
    /// Requests refused (a prompt larger than a replica's cache).
    pub rejected: usize,
    /// Requests that failed on a replica being removed (a drain that lost them).
    pub failed_at_scale_down: usize,
    /// At the end: requests waiting at the frontend for a ready replica (disaggregated:
    /// a prefill replica).
    pub frontend_queue: usize,
    /// At the end, disaggregated: prefilled requests waiting for a decode replica.
    pub handoff_queue: usize,
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
    /// KV transfers under way to it (a decode replica).
    incoming: usize,
}

#[derive(Debug)]
struct Stream {
    replica: u64,
    /// The pick of the pool it is in now; `None` while it waits for a decode replica.
    pick: Option<Pick>,
    prefill_replica: Option<u64>,
    /// Its prefill produced its (unsent) token.
    prefilled: bool,
    first: Option<f64>,
    last: Option<f64>,
    tokens: u32,
}

/// A KV handoff under way.
#[derive(Debug)]
struct Transfer {
    index: usize,
    replica: u64,
    end_ms: f64,
    tokens: Vec<u32>,
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
    /// `agg`; or `prefill` (the frontend's queue) then `decode`.
    pools: Vec<Pool>,
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
        let pools = config
            .roles()
            .iter()
            .map(|&role| {
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
            transfers: Vec::new(),
            streams: FxHashMap::default(),
            base,
            window: WindowStats::default(),
            outputs: Vec::new(),
            config,
        };
        let initial = match lab.config.disagg {
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

    /// The pools, the one that takes arrivals first: `agg`, or `prefill` and `decode`.
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

    fn pool(&self, role: DisaggRole) -> usize {
        self.pools.iter().position(|p| p.role == role).unwrap_or(0)
    }

    /// Replica `i`'s load as its pool's router sees it, at `t`.
    fn report_load(&self, i: usize, t: f64) {
        let r = &self.replicas[i];
        self.pools[self.pool(r.role)].router.load().lock().update_metrics(r.id, &r.worker.metrics(), self.at(t));
    }

    /// Forget a replica that is gone (its cost counted to now).
    fn retire(&mut self, i: usize) {
        let gone = self.replicas.remove(i);
        self.retired_ms += self.now_ms - gone.requested_ms;
        self.retired_role_ms[role_index(gone.role)] += self.now_ms - gone.requested_ms;
        self.pools[self.pool(gone.role)].router.remove_worker(gone.id);
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
            self.dispatch_queue(role, self.now_ms);
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

    /// Send request `index` to a ready replica of `role` at `t`; false when none is ready
    /// (or, with a busy threshold, none is free). To a decode replica: its KV transfer
    /// starts.
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
        let p = self.pool(role);
        self.pools[p].selector.set_clock(self.at(t));
        let Ok(pick) = self.pools[p].selector.select(&tokens, &ids) else { return false };
        let Some(i) = self.replicas.iter().position(|r| r.id == pick.instance) else { return false };
        if role == DisaggRole::Decode {
            let blocks = tokens.len() / self.config.engine.block_size;
            let end_ms = t + self.config.engine.transfer_seconds(blocks) * 1000.0;
            self.replicas[i].incoming += 1;
            let replica = pick.instance;
            if let Some(stream) = self.streams.get_mut(&index) {
                stream.replica = replica;
                stream.pick = Some(pick);
            }
            self.transfers.push(Transfer { index, replica, end_ms, tokens });
            return true;
        }
        let max_tokens = if role == DisaggRole::Prefill { 1 } else { self.requests[index].output_length.max(1) };
        if self.replicas[i].worker.add(index as u64, tokens, max_tokens).is_err() {
            self.pools[p].selector.on_end(pick, Outcome::Failed);
            self.window.rejected += 1;
            return true;
        }
        let stream = Stream {
            replica: pick.instance,
            pick: Some(pick),
            prefill_replica: None,
            prefilled: false,
            first: None,
            last: None,
            tokens: 0,
        };
        self.streams.insert(index, stream);
        self.start_step(i, t);
        true
    }

    fn dispatch_queue(&mut self, role: DisaggRole, t: f64) {
        let p = self.pool(role);
        while let Some(&index) = self.pools[p].queue.front() {
            if !self.dispatch(role, index, t) {
                break;
            }
            self.pools[p].queue.pop_front();
        }
    }

    /// KV transfer `k` arrived: its blocks are cached on the decode replica, which
    /// takes the request.
    fn land(&mut self, k: usize, t: f64) {
        let transfer = self.transfers.remove(k);
        let Some(i) = self.replicas.iter().position(|r| r.id == transfer.replica) else { return };
        self.replicas[i].incoming -= 1;
        self.replicas[i].worker.import_kv(&transfer.tokens);
        let output_length = self.requests[transfer.index].output_length.max(1);
        if self.replicas[i].worker.add(transfer.index as u64, transfer.tokens, output_length).is_err() {
            // Cannot happen: both pools run the same engine, whose prefill took the prompt.
            if let Some(pick) = self.streams.remove(&transfer.index).and_then(|s| s.pick) {
                self.pools[self.pool(DisaggRole::Decode)].selector.on_end(pick, Outcome::Failed);
            }
            self.window.rejected += 1;
            self.retire_if_drained(i);
            return;
        }
        self.start_step(i, t);
        self.report_load(i, t);
    }

    fn finish_step(&mut self, i: usize, t: f64) {
        self.replicas[i].step_end = None;
        let mut outputs = std::mem::take(&mut self.outputs);
        outputs.clear();
        self.replicas[i].worker.finish_step(&mut outputs);
        let draining = self.replicas[i].state == ReplicaState::Draining;
        let role = self.replicas[i].role;
        let p = self.pool(role);
        let mut prefilled = false;
        for out in &outputs {
            let index = out.request as usize;
            let Some(stream) = self.streams.get_mut(&index) else { continue };
            if out.token {
                if role == DisaggRole::Prefill {
                    // The prefill's one token is not sent: the decode replica's first is.
                    stream.prefilled = true;
                } else {
                    stream.first.get_or_insert(t);
                    stream.last = Some(t);
                    stream.tokens += 1;
                }
            }
            if out.finished && role == DisaggRole::Prefill && stream.prefilled {
                // Prefilled: its KV goes to a decode replica.
                stream.prefill_replica = Some(stream.replica);
                if let Some(pick) = stream.pick.take() {
                    self.pools[p].selector.set_clock(self.at(t));
                    self.pools[p].selector.on_end(pick, Outcome::Completed);
                }
                let decode = self.pool(DisaggRole::Decode);
                self.pools[decode].queue.push_back(index);
                prefilled = true;
            } else if out.finished {
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
                    self.pools[p].selector.set_clock(self.at(t));
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
        if prefilled {
            self.dispatch_queue(DisaggRole::Decode, t);
        }
    }

    /// Run the simulation up to `until_s` and return what happened since the last call.
    /// A time in the past leaves the clock where it is.
    pub fn advance(&mut self, until_s: f64) -> Result<WindowStats, LabError> {
        let until = (until_s * 1000.0).max(self.now_ms);
        let entry = self.roles()[0];
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
            // At equal times: a replica becomes ready, then a step ends, then a transfer
            // lands, then a request arrives.
            let earliest = [ready.map(|r| r.1), step.map(|s| s.1), transfer.map(|x| x.1), arrival]
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
                    self.dispatch_queue(role, t);
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
                _ => {
                    let index = self.order[self.next];
                    self.next += 1;
                    self.window.arrivals += 1;
                    self.window.arrival_input_tokens += self.requests[index].input_length as u64;
                    let p = self.pool(entry);
                    if !self.pools[p].queue.is_empty() || !self.dispatch(entry, index, earliest) {
                        self.pools[p].queue.push_back(index);
                    }
                }
            }
        }
        self.now_ms = until;
        let mut window = std::mem::take(&mut self.window);
        window.end_s = until / 1000.0;
        window.frontend_queue = self.pools[self.pool(entry)].queue.len();
        window.handoff_queue = if self.config.disagg.is_some() { self.pools[self.pool(DisaggRole::Decode)].queue.len() } else { 0 };
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

    fn disagg(prefill_replicas: usize, decode_replicas: usize) -> PlannerLabConfig {
        PlannerLabConfig { replicas: 0, disagg: Some(DisaggPools { prefill_replicas, decode_replicas }), ..config(0) }
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
            assert_eq!(roles[&f.prefill_replica.unwrap()], DisaggRole::Prefill);
            assert_eq!(roles[&f.replica], DisaggRole::Decode);
        }
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
    fn draining_either_pool_loses_nothing() {
        let trace = steady(20.0, 10.0, 1000, 200);
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
        assert!(late.into_iter().all(|f| kept.contains(&f.replica) && kept.contains(&f.prefill_replica.unwrap())));
    }

    #[test]
    fn a_small_prefill_pool_shows_in_ttft_and_a_small_decode_pool_in_itl() {
        let play = |trace: &[TraceRequest], prefill: usize, decode: usize| {
            let mut lab = PlannerLab::new(trace.to_vec(), disagg(prefill, decode)).unwrap();
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

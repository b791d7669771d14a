//! The routing lab: replay a request trace through `N` simulated mocker engines
//! ([`SimWorker`]) on a virtual clock, routing each arrival with one policy, and report
//! what an operator compares policies by: prefix-cache hit rate, TTFT, ITL, throughput
//! and load imbalance.
//!
//! The trace is in the Mooncake format, read and turned into prompts by
//! [`crate::lab_trace`] (re-exported here).
//!
//! The loop is discrete-event: the next thing to happen is either the next arrival or
//! the end of a worker's step, whichever is earlier; nothing sleeps. After each step
//! the worker's KV events (policy `kv` only) and load metrics reach the router at once,
//! and the router sees each stream's timing (the straggler penalty).
//! The same trace, policy, configuration and seed give the same report.
//!
//! It sits beside the router and the engines, importing both. Every policy picks
//! through the frontend's own [`crate::routing`] selectors, in their life cycle
//! (`select` at arrival, `on_end` when the stream finishes): `round-robin` from position
//! 0, `random` seeded, and `kv`/`approx` through a [`KvSelector`] replaying on the lab's
//! virtual clock with seeded draws (so a request's load and blocks stop counting on its
//! worker as the frontend's do).
//!
//! Admission: with [`LabConfig::admission`] set, each arrival passes the frontend's own
//! admission decisions ([`crate::http::admission`]: requests in flight, queued prompt
//! tokens, the TTFT target against the selector's estimate) on the virtual clock before it
//! is routed; the report counts the requests admitted and refused, and its TTFT
//! percentiles are those of the admitted requests.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::engines::mocker::{MockerArgs, SimOutput, SimWorker};
use crate::admission::{inflight_refusal, queued_tokens_refusal, ttft_refusal, AdmissionLimits};
use crate::kv_router::{KvCacheEvent, KvRouter, KvRouterConfig, RouterEvent, SchedulerConfig};
use crate::lab_trace::percentile;
pub use crate::lab_trace::{
    lab_engine_args, read_trace, synthesize_tokens, LabError, TraceRequest, DEFAULT_LAB_GPU_BLOCKS,
    DEFAULT_TRACE_BLOCK_SIZE,
};
use crate::routing::{self, KvSelector, Outcome, Pick, RouterMode, Selector};

/// The model name of the lab's admission decisions (their messages only).
const LAB_MODEL: &str = "lab";

/// How the lab chooses a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Policy {
    /// The KV router, its index corrected by the workers' KV events.
    Kv,
    /// The KV router on its own predictions only (no KV events).
    Approx,
    /// Each worker in turn.
    RoundRobin,
    /// A worker at random.
    Random,
}

impl Policy {
    /// Its name on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Kv => "kv",
            Policy::Approx => "approx",
            Policy::RoundRobin => "round-robin",
            Policy::Random => "random",
        }
    }
}

impl FromStr for Policy {
    type Err = LabError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        // The frontend's router modes, parsed by their one parser, and the lab's own
        // `approx` (KV routing without KV events).
        match s.parse::<RouterMode>() {
            _ if s == "approx" => Ok(Policy::Approx),
            Ok(RouterMode::Kv) => Ok(Policy::Kv),
            Ok(RouterMode::RoundRobin) => Ok(Policy::RoundRobin),
            Ok(RouterMode::Random) => Ok(Policy::Random),
            Err(_) => Err(LabError::Invalid(format!("unknown policy '{s}': expected kv, approx, round-robin or random"))),
        }
    }
}

/// The lab's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct LabConfig {
    /// Simulated workers (at least 1).
    pub workers: usize,
    /// Tokens per trace block.
    pub trace_block_size: usize,
    /// Every worker's engine (its `block_size` is also the router's); default the
    /// mocker's with [`DEFAULT_LAB_GPU_BLOCKS`] (see [`lab_engine_args`]).
    pub engine: MockerArgs,
    /// The KV router's cost, temperature, straggler penalty (policies `kv`, `approx`).
    pub scheduler: SchedulerConfig,
    /// Worker 0's steps take this many times longer (1: a uniform fleet).
    pub slow_worker_factor: f64,
    /// Arrival rate multiplier: timestamps are divided by it (2: twice as fast).
    pub time_scale: f64,
    /// Seed of the random choices (ties, temperature, `random`).
    pub seed: u64,
    /// The frontend's admission limits (none by default).
    pub admission: AdmissionLimits,
}

impl Default for LabConfig {
    fn default() -> Self {
        LabConfig {
            workers: 4,
            trace_block_size: DEFAULT_TRACE_BLOCK_SIZE,
            engine: MockerArgs { num_gpu_blocks: DEFAULT_LAB_GPU_BLOCKS, ..MockerArgs::default() },
            scheduler: SchedulerConfig::default(),
            slow_worker_factor: 1.0,
            time_scale: 1.0,
            seed: 0,
            admission: AdmissionLimits::default(),
        }
    }
}

impl LabConfig {
    /// Check the ranges.
    pub fn validate(&self) -> Result<(), LabError> {
        let invalid = |m: String| Err(LabError::Invalid(m));
        if self.workers == 0 {
            return invalid("workers must be at least 1".into());
        }
        if self.trace_block_size == 0 {
            return invalid("the trace block size must be at least 1".into());
        }
        if !(self.slow_worker_factor.is_finite() && self.slow_worker_factor >= 1.0) {
            return invalid(format!("the slow worker factor must be >= 1, got {}", self.slow_worker_factor));
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return invalid(format!("the time scale must be > 0, got {}", self.time_scale));
        }
        let a = &self.admission;
        if a.max_inflight_requests == Some(0) || a.max_queued_tokens == Some(0) || a.ttft_target == Some(Duration::ZERO) {
            return invalid(format!("admission limits must be above 0, got {a:?}"));
        }
        self.engine.validate().map_err(|e| LabError::Invalid(format!("engine arguments: {e}")))?;
        self.scheduler.validate().map_err(LabError::Invalid)
    }
}

/// What one policy did with a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct LabReport {
    /// The policy.
    pub policy: Policy,
    /// Requests in the trace.
    pub requests: usize,
    /// Requests that produced all their tokens.
    pub completed: usize,
    /// Requests admitted and sent to a worker.
    pub admitted: usize,
    /// Requests refused by admission (429 at the frontend).
    pub refused: usize,
    /// Requests refused (a prompt larger than a worker's cache, or all workers busy).
    pub rejected: usize,
    /// Prompt blocks found in the workers' prefix caches / looked up.
    pub hit_rate: f64,
    /// Time to first token, milliseconds, of every request that produced one (admitted
    /// ones), in arrival order.
    pub ttft_ms: Vec<f64>,
    /// Median time to first token (ms).
    pub ttft_p50_ms: f64,
    /// 99th percentile time to first token (ms).
    pub ttft_p99_ms: f64,
    /// Median gap between tokens of a stream (ms).
    pub itl_p50_ms: f64,
    /// Output tokens per simulated second, first arrival to last token.
    pub throughput_tok_s: f64,
    /// Largest worker's mean active KV blocks over the fleet's mean (1: perfectly even),
    /// sampled at each arrival.
    pub load_imbalance: f64,
    /// Requests sent to each worker.
    pub per_worker: Vec<u64>,
    /// Simulated seconds from the first arrival to the last token.
    pub simulated_s: f64,
}

#[derive(Debug)]
struct Stream {
    /// The selector's pick, told how the request ended when it finishes.
    pick: Pick,
    arrival: f64,
    /// Prompt tokens, queued (for admission) until its first token.
    prompt_tokens: u64,
    /// Time of its latest token.
    last: Option<f64>,
}

/// Replay `trace` with `policy`.
pub fn run(trace: &[TraceRequest], policy: Policy, config: &LabConfig) -> Result<LabReport, LabError> {
    config.validate()?;
    let n = config.workers;
    let mut workers = (0..n)
        .map(|w| {
            let slowdown = if w == 0 { config.slow_worker_factor } else { 1.0 };
            SimWorker::new(config.engine.clone(), slowdown).map_err(|e| LabError::Invalid(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let router_config = KvRouterConfig {
        block_size: config.engine.block_size as u32,
        scheduler: config.scheduler,
        use_kv_events: policy == Policy::Kv,
        ..Default::default()
    };
    let router: Arc<KvRouter> = KvRouter::new(router_config);
    let ids: Vec<u64> = (0..n as u64).collect();
    let base = Instant::now();
    let at = |ms: f64| base + Duration::from_secs_f64(ms / 1000.0);

    let mut order: Vec<usize> = (0..trace.len()).collect();
    order.sort_by(|&a, &b| trace[a].timestamp.total_cmp(&trace[b].timestamp));
    let arrival = |i: usize| trace[i].timestamp / config.time_scale;

    let mut step_end: Vec<Option<f64>> = vec![None; n];
    // Requests in flight, by their index in the trace.
    let mut streams: Vec<Option<Stream>> = (0..trace.len()).map(|_| None).collect();
    let mut ttft = vec![f64::NAN; trace.len()];
    let mut itl: Vec<f32> = Vec::new();
    let mut outputs: Vec<SimOutput> = Vec::new();
    let (mut completed, mut rejected, mut tokens_out) = (0usize, 0usize, 0u64);
    let mut per_worker = vec![0u64; n];
    let mut active_sum = vec![0f64; n];
    let mut samples = 0u64;
    let mut event_id = 0u64;
    let (mut first_arrival, mut last_token) = (None::<f64>, 0f64);
    let mut next = 0;
    // Admission's counts: requests in flight and prompt tokens without a first token.
    let (mut admitted, mut refused, mut inflight, mut queued_tokens) = (0usize, 0usize, 0usize, 0u64);
    let limits = &config.admission;
    let uses_router = matches!(policy, Policy::Kv | Policy::Approx);
    // The frontend's selectors, started where the lab's replay is reproducible.
    let kv = uses_router.then(|| Arc::new(KvSelector::replaying(router.clone(), base, config.seed)));
    let selector: Arc<dyn Selector> = match (policy, &kv) {
        (Policy::Kv | Policy::Approx, Some(kv)) => kv.clone(),
        (Policy::Random, _) => Arc::new(routing::Random::seeded(config.seed)),
        _ => Arc::new(routing::RoundRobin::starting_at(0)),
    };
    // Selects and ends happen on the virtual clock.
    let set_clock = |t: f64| {
        if let Some(kv) = &kv {
            kv.set_clock(at(t));
        }
    };

    loop {
        let next_arrival = order.get(next).map(|&i| arrival(i));
        let next_step = step_end.iter().enumerate().filter_map(|(w, t)| t.map(|t| (w, t))).min_by(|a, b| a.1.total_cmp(&b.1));
        match (next_arrival, next_step) {
            (None, None) => break,
            (Some(t), step) if step.is_none_or(|(_, s)| t <= s) => {
                let i = order[next];
                next += 1;
                first_arrival.get_or_insert(t);
                for (w, worker) in workers.iter().enumerate() {
                    let metrics = worker.metrics();
                    active_sum[w] += metrics.kv_active_blocks as f64;
                    if uses_router {
                        router.load().lock().update_metrics(ids[w], &metrics, at(t));
                    }
                }
                samples += 1;
                let tokens = synthesize_tokens(&trace[i], i, config.trace_block_size);
                set_clock(t);
                let prompt_tokens = tokens.len() as u64;
                let refusal = inflight_refusal(limits, LAB_MODEL, inflight)
                    .or_else(|| queued_tokens_refusal(limits, LAB_MODEL, queued_tokens, prompt_tokens))
                    .or_else(|| {
                        let estimate = limits.ttft_target.and_then(|_| selector.ttft_estimate(&tokens, &ids));
                        ttft_refusal(limits, LAB_MODEL, estimate)
                    });
                if refusal.is_some() {
                    refused += 1;
                    continue;
                }
                let pick = match selector.select(&tokens, &ids) {
                    // Its timing runs on the virtual clock.
                    Ok(pick) => Pick { load: pick.load.map(|l| l.started_at(at(t))), ..pick },
                    Err(_) => {
                        // Every worker busy (503 at the frontend).
                        rejected += 1;
                        continue;
                    }
                };
                let w = pick.instance as usize;
                if workers[w].add(i as u64, tokens, trace[i].output_length.max(1)).is_err() {
                    selector.on_end(pick, Outcome::Failed);
                    rejected += 1;
                    continue;
                }
                per_worker[w] += 1;
                admitted += 1;
                inflight += 1;
                queued_tokens += prompt_tokens;
                streams[i] =
                    Some(Stream { pick, arrival: t, prompt_tokens, last: None });
                if step_end[w].is_none() {
                    step_end[w] = workers[w].start_step().map(|ms| t + ms);
                }
            }
            (_, Some((w, t))) => {
                outputs.clear();
                workers[w].finish_step(&mut outputs);
                for out in &outputs {
                    let Some(stream) = streams[out.request as usize].as_mut() else { continue };
                    if out.token {
                        tokens_out += 1;
                        last_token = last_token.max(t);
                        // The selector times the stream (TTFT, time per item) as the
                        // frontend's streams are timed.
                        if let Some(load) = stream.pick.load.as_mut() {
                            load.observe_item_at(at(t));
                        }
                        match stream.last {
                            None => {
                                ttft[out.request as usize] = t - stream.arrival;
                                queued_tokens -= stream.prompt_tokens;
                            }
                            Some(last) => itl.push((t - last) as f32),
                        }
                        stream.last = Some(t);
                    }
                    if out.finished {
                        if out.token || stream.last.is_some() {
                            completed += 1;
                        } else {
                            rejected += 1;
                            queued_tokens -= stream.prompt_tokens;
                        }
                        inflight -= 1;
                        if let Some(ended) = streams[out.request as usize].take() {
                            set_clock(t);
                            selector.on_end(ended.pick, Outcome::Completed);
                        }
                    }
                }
                let events = workers[w].take_events();
                if policy == Policy::Kv {
                    for data in events {
                        event_id += 1;
                        let event = RouterEvent { worker_id: ids[w], event: KvCacheEvent { event_id, data } };
                        router.apply_event(&event);
                    }
                }
                if uses_router {
                    router.load().lock().update_metrics(ids[w], &workers[w].metrics(), at(t));
                }
                step_end[w] = workers[w].start_step().map(|ms| t + ms);
                if step_end[w].is_none() && workers[w].requests() > 0 {
                    // Queued requests the engine cannot schedule now and never will
                    // (cannot happen with validated prompts; guards the loop).
                    return Err(LabError::Invalid(format!("worker {w} is stuck with {} requests", workers[w].requests())));
                }
            }
            (Some(_), None) => unreachable!("an arrival with no step pending is handled above"),
        }
    }

    let (queried, hit) = workers.iter().fold((0u64, 0u64), |(q, h), w| {
        let (wq, wh) = w.prefix_blocks();
        (q + wq, h + wh)
    });
    let ttft_ms: Vec<f64> = ttft.iter().copied().filter(|x| x.is_finite()).collect();
    let mut sorted = ttft_ms.clone();
    sorted.sort_by(f64::total_cmp);
    itl.sort_by(f32::total_cmp);
    let itl_p50 = itl.get(itl.len().saturating_sub(1) / 2).map_or(f64::NAN, |x| *x as f64);
    let simulated_ms = first_arrival.map_or(0.0, |f| (last_token - f).max(0.0));
    let means: Vec<f64> = active_sum.iter().map(|s| s / samples.max(1) as f64).collect();
    let mean = means.iter().sum::<f64>() / n as f64;
    let max = means.iter().copied().fold(0.0, f64::max);
    Ok(LabReport {
        policy,
        requests: trace.len(),
        completed,
        admitted,
        refused,
        rejected,
        hit_rate: if queried == 0 { 0.0 } else { hit as f64 / queried as f64 },
        ttft_p50_ms: percentile(&sorted, 0.5),
        ttft_p99_ms: percentile(&sorted, 0.99),
        ttft_ms,
        itl_p50_ms: itl_p50,
        throughput_tok_s: if simulated_ms > 0.0 { tokens_out as f64 / (simulated_ms / 1000.0) } else { 0.0 },
        load_imbalance: if mean > 0.0 { max / mean } else { 1.0 },
        per_worker,
        simulated_s: simulated_ms / 1000.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Conversations: each session's turns extend its previous prompt (shared prefix),
    /// every session starting with the same system block 0.
    fn conversations(sessions: u64, turns: u64, gap_ms: f64) -> Vec<TraceRequest> {
        let mut trace = Vec::new();
        let mut next_id = 1;
        let mut prompts: Vec<Vec<u64>> = vec![vec![0]; sessions as usize];
        for turn in 0..turns {
            for (s, prompt) in prompts.iter_mut().enumerate() {
                prompt.extend([next_id, next_id + 1]);
                next_id += 2;
                let t = (turn * sessions + s as u64) as f64 * gap_ms;
                let blocks = prompt.len();
                trace.push(TraceRequest {
                    timestamp: t,
                    input_length: blocks * 64 - 10,
                    output_length: 20,
                    hash_ids: prompt.clone(),
                });
            }
        }
        trace
    }

    fn config() -> LabConfig {
        LabConfig {
            workers: 4,
            trace_block_size: 64,
            engine: MockerArgs { block_size: 16, num_gpu_blocks: 2048, ..Default::default() },
            ..Default::default()
        }
    }

    #[test]
    fn kv_routing_beats_round_robin_on_hit_rate_and_is_deterministic() {
        // 13 sessions: round-robin moves each session from worker to worker.
        let trace = conversations(13, 6, 150.0);
        let kv = run(&trace, Policy::Kv, &config()).unwrap();
        let rr = run(&trace, Policy::RoundRobin, &config()).unwrap();
        assert_eq!((kv.completed, rr.completed), (trace.len(), trace.len()));
        assert_eq!((kv.rejected, rr.rejected), (0, 0));
        assert!(kv.hit_rate > rr.hit_rate + 0.2, "kv {} vs round-robin {}", kv.hit_rate, rr.hit_rate);
        assert!(kv.ttft_p50_ms > 0.0 && kv.itl_p50_ms > 0.0 && kv.throughput_tok_s > 0.0);
        assert_eq!(kv.ttft_ms.len(), trace.len());
        assert_eq!(run(&trace, Policy::Kv, &config()).unwrap(), kv, "same seed, same report");
        let random = run(&trace, Policy::Random, &config()).unwrap();
        assert_eq!(random.per_worker.iter().sum::<u64>(), trace.len() as u64);
    }

    #[test]
    fn a_slow_worker_gets_less_with_the_straggler_penalty() {
        let trace = conversations(16, 12, 20.0);
        let slow = LabConfig { slow_worker_factor: 6.0, ..config() };
        let penalised = run(&trace, Policy::Kv, &slow).unwrap();
        let off = LabConfig {
            scheduler: SchedulerConfig { straggler_threshold: f64::INFINITY, ..Default::default() },
            ..slow.clone()
        };
        let unpenalised = run(&trace, Policy::Kv, &off).unwrap();
        assert!(
            penalised.per_worker[0] < unpenalised.per_worker[0],
            "{:?} vs {:?}",
            penalised.per_worker,
            unpenalised.per_worker
        );
    }

    #[test]
    fn admission_refuses_on_the_virtual_clock_and_keeps_the_admitted_ttft_down() {
        // Sessions arriving faster than four workers serve them.
        let trace = conversations(16, 12, 2.0);
        for policy in [Policy::Kv, Policy::RoundRobin] {
            let open = run(&trace, policy, &config()).unwrap();
            assert_eq!((open.admitted, open.refused), (trace.len(), 0), "no limits: all admitted");
            let target = Duration::from_secs_f64(open.ttft_p50_ms / 1000.0);
            let limits = AdmissionLimits { ttft_target: Some(target), ..AdmissionLimits::default() };
            let targeted = LabConfig { admission: limits, ..config() };
            let report = run(&trace, policy, &targeted).unwrap();
            assert!(report.refused > 0, "{policy:?}: a target at the open run's median TTFT refuses some");
            assert_eq!(report.admitted + report.refused, trace.len());
            assert_eq!(report.completed, report.admitted);
            // KV routing sends a request where the estimate is lowest; round-robin sends
            // it in turn (its estimate is the fleet's mean), and a session whose last
            // turn was refused loses its cached prefix: only its median improves.
            let (admitted, open) = match policy {
                Policy::Kv => (report.ttft_p99_ms, open.ttft_p99_ms),
                _ => (report.ttft_p50_ms, open.ttft_p50_ms),
            };
            assert!(
                admitted < open,
                "{policy:?}: admitted TTFT {admitted} ms vs {open} ms without the target"
            );
            assert_eq!(run(&trace, policy, &targeted).unwrap(), report, "same seed, same report");
        }
        let capped = LabConfig {
            admission: AdmissionLimits { max_inflight_requests: Some(4), ..AdmissionLimits::default() },
            ..config()
        };
        let report = run(&trace, Policy::Kv, &capped).unwrap();
        assert!(report.refused > 0 && report.admitted + report.refused == trace.len(), "{report:?}");
        let tokens = LabConfig {
            admission: AdmissionLimits { max_queued_tokens: Some(1_000), ..AdmissionLimits::default() },
            ..config()
        };
        assert!(run(&trace, Policy::Kv, &tokens).unwrap().refused > 0);
    }

    #[test]
    fn the_lab_fleet_defaults_to_gpu_sized_caches() {
        assert_eq!(LabConfig::default().engine, lab_engine_args(None).unwrap());
    }

    #[test]
    fn bad_input_is_a_clear_error() {
        assert!("nope".parse::<Policy>().unwrap_err().to_string().contains("unknown policy"));
        let err = run(&[], Policy::Kv, &LabConfig { workers: 0, ..config() }).unwrap_err();
        assert!(err.to_string().contains("workers"));
        let dir = std::env::temp_dir().join(format!("lab-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.jsonl");
        std::fs::write(&path, "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1}\n\nnot json\n").unwrap();
        let err = read_trace(&path).unwrap_err();
        assert!(matches!(err, LabError::Parse { line: 3, .. }), "{err}");
        assert!(read_trace(&dir.join("missing.jsonl")).unwrap_err().to_string().contains("missing.jsonl"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

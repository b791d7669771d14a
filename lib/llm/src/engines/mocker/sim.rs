//! A mocker engine stepped by hand on simulated time, for discrete-event simulations
//! (the routing lab, [`crate::routing_lab`]): no task, no sleeping. The caller
//! starts a step ([`SimWorker::start_step`], which says how long it takes), advances
//! its own clock, and finishes it ([`SimWorker::finish_step`]), collecting the tokens
//! produced and the KV events the step queued. The scheduler, KV manager and timing
//! model are the engine's own.

use rustc_hash::FxHashMap;
use tokio::sync::mpsc;

use super::args::{ArgsError, MockerArgs};
use crate::kv_router::protocols::{hash_full_blocks, ForwardPassMetrics, KvCacheEventData};
use super::scheduler::{Command, NewRequest, Scheduler, StepPlan};
use super::timing::step_ms;
use crate::engine::EngineError;
use crate::protocols::common::LLMEngineOutput;

type Receiver = mpsc::UnboundedReceiver<Result<LLMEngineOutput, EngineError>>;

/// A token (or the end) of one request, produced by a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimOutput {
    /// The request's id (as given to [`SimWorker::add`]).
    pub request: u64,
    /// Whether a token was produced (`false`: the request failed).
    pub token: bool,
    /// Whether the request is done.
    pub finished: bool,
}

/// One simulated engine.
#[derive(Debug)]
pub struct SimWorker {
    scheduler: Scheduler,
    args: MockerArgs,
    /// Multiplies every step's time (a slow worker).
    slowdown: f64,
    receivers: FxHashMap<u64, Receiver>,
    step: Option<StepPlan>,
    events: Vec<KvCacheEventData>,
}

impl SimWorker {
    /// An idle engine with `args` whose steps take `slowdown` times the timing model's
    /// (≥ 1 for a straggler). `speedup_ratio` is ignored: time is simulated.
    pub fn new(args: MockerArgs, slowdown: f64) -> Result<Self, ArgsError> {
        args.validate()?;
        if !(slowdown.is_finite() && slowdown > 0.0) {
            return Err(ArgsError::Invalid(format!("slowdown must be > 0, got {slowdown}")));
        }
        Ok(SimWorker {
            scheduler: Scheduler::new(args.clone()),
            args,
            slowdown,
            receivers: FxHashMap::default(),
            step: None,
            events: Vec::new(),
        })
    }

    /// Its configuration.
    pub fn args(&self) -> &MockerArgs {
        &self.args
    }

    /// Queue request `id` (unique per worker) with `tokens`, to generate `max_tokens`
    /// (at least 1). A prompt that can never fit is refused.
    pub fn add(&mut self, id: u64, tokens: Vec<u32>, max_tokens: usize) -> Result<(), String> {
        let usable = self.args.num_gpu_blocks - self.args.watermark_blocks();
        if tokens.is_empty() || (tokens.len() + 1).div_ceil(self.args.block_size) > usable {
            return Err(format!("prompt of {} tokens does not fit in {usable} blocks", tokens.len()));
        }
        let (output, rx) = mpsc::unbounded_channel();
        let seed = self.args.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.scheduler.handle(Command::Add(NewRequest { id, tokens, max_tokens: max_tokens.max(1), seed, output }));
        self.receivers.insert(id, rx);
        Ok(())
    }

    /// Drop request `id`, queued or running, as a cancelled request leaves the engine:
    /// its blocks are released, and it produces nothing more (a step under way ends
    /// without it). Whether it was here.
    pub fn cancel(&mut self, id: u64) -> bool {
        if self.receivers.remove(&id).is_none() {
            return false;
        }
        self.scheduler.handle(Command::Cancel(id));
        self.events.extend(self.scheduler.kv.take_events());
        true
    }

    /// Store the full blocks of the prompt `tokens`, computed on another worker (a
    /// disaggregated prefill's KV handoff), as cached ones, as `receive_kv` does; returns
    /// how many leading blocks are now cached.
    pub fn import_kv(&mut self, tokens: &[u32]) -> usize {
        let blocks = self.scheduler.import(&hash_full_blocks(tokens, self.args.block_size));
        self.events.extend(self.scheduler.kv.take_events());
        blocks
    }

    /// The prompt `tokens`' cached prefix, in tokens (whole blocks), as `cached_prefix_tokens`
    /// answers a decode worker deciding where to prefill.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> usize {
        let hashes: Vec<u64> = hash_full_blocks(tokens, self.args.block_size).into_iter().map(|h| h.block_hash).collect();
        self.scheduler.cached_prefix_blocks(&hashes) * self.args.block_size
    }

    /// Whether a step is under way.
    pub fn stepping(&self) -> bool {
        self.step.is_some()
    }

    /// Requests queued or running.
    pub fn requests(&self) -> usize {
        self.receivers.len()
    }

    /// Plan the next step: its simulated milliseconds, or `None` when there is nothing
    /// to do (or a step is already under way).
    pub fn start_step(&mut self) -> Option<f64> {
        if self.step.is_some() || self.scheduler.is_idle() {
            return None;
        }
        let plan = self.scheduler.schedule();
        self.events.extend(self.scheduler.kv.take_events());
        if plan.scheduled.is_empty() {
            return None;
        }
        let ms = step_ms(&self.args, &plan.work) * self.slowdown;
        self.step = Some(plan);
        Some(ms)
    }

    /// Finish the step under way, appending what it produced to `out`.
    pub fn finish_step(&mut self, out: &mut Vec<SimOutput>) {
        let Some(plan) = self.step.take() else { return };
        self.scheduler.apply(&plan);
        self.events.extend(self.scheduler.kv.take_events());
        for step in &plan.scheduled {
            self.drain(step.id, out);
        }
        // A request can also end outside the plan (it outgrew the cache while queued).
        if self.receivers.len() > self.scheduler.running.len() + self.scheduler.waiting.len() {
            let ids: Vec<u64> = self.receivers.keys().copied().collect();
            for id in ids {
                self.drain(id, out);
            }
        }
    }

    fn drain(&mut self, id: u64, out: &mut Vec<SimOutput>) {
        let Some(rx) = self.receivers.get_mut(&id) else { return };
        let mut finished = false;
        while let Ok(item) = rx.try_recv() {
            match item {
                Ok(item) => {
                    finished = item.finish_reason.is_some();
                    out.push(SimOutput { request: id, token: !item.token_ids.is_empty(), finished });
                }
                Err(_) => {
                    finished = true;
                    out.push(SimOutput { request: id, token: false, finished });
                }
            }
        }
        if finished {
            self.receivers.remove(&id);
        }
    }

    /// The KV events queued since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvCacheEventData> {
        std::mem::take(&mut self.events)
    }

    /// The current load, as the engine would publish it.
    pub fn metrics(&self) -> ForwardPassMetrics {
        self.scheduler.metrics()
    }

    /// Prompt blocks looked up in the prefix cache at admission, and those found.
    pub fn prefix_blocks(&self) -> (u64, u64) {
        self.scheduler.prefix_counts()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(worker: &mut SimWorker) -> (f64, Vec<SimOutput>) {
        let (mut now, mut out) = (0.0, Vec::new());
        while let Some(ms) = worker.start_step() {
            now += ms;
            worker.finish_step(&mut out);
        }
        (now, out)
    }

    #[test]
    fn steps_produce_tokens_on_simulated_time() {
        let args = MockerArgs { block_size: 4, ..Default::default() };
        let mut worker = SimWorker::new(args.clone(), 1.0).unwrap();
        worker.add(1, (0..40).collect(), 3).unwrap();
        let (elapsed, out) = run(&mut worker);
        assert_eq!(out.iter().filter(|o| o.token).count(), 3);
        assert!(out.last().unwrap().finished);
        assert!(elapsed > 0.0);
        assert_eq!(worker.requests(), 0);
        assert!(matches!(worker.take_events().first(), Some(KvCacheEventData::Stored(_))));

        // The same prompt again hits the cache and is faster; a slow worker is slower.
        worker.add(2, (0..40).collect(), 3).unwrap();
        let (again, _) = run(&mut worker);
        assert!(again < elapsed, "{again} vs {elapsed}");
        assert_eq!(worker.prefix_blocks(), (20, 10), "the second prompt's 10 blocks were cached");
        let mut slow = SimWorker::new(args, 3.0).unwrap();
        slow.add(1, (0..40).collect(), 3).unwrap();
        let (slow_elapsed, _) = run(&mut slow);
        assert!((slow_elapsed - 3.0 * elapsed).abs() < 1e-6);
        assert!(slow.add(9, vec![], 1).is_err());
    }

    #[test]
    fn a_cancelled_request_leaves_mid_step_and_frees_its_blocks() {
        let args = MockerArgs { block_size: 4, ..Default::default() };
        let mut worker = SimWorker::new(args, 1.0).unwrap();
        worker.add(1, (0..400).collect(), 3).unwrap();
        worker.add(2, (1000..1040).collect(), 3).unwrap();
        assert!(worker.start_step().is_some());
        assert!(worker.metrics().kv_active_blocks > 100);
        assert!(worker.cancel(1));
        assert!(!worker.cancel(1), "already gone");
        assert_eq!(worker.requests(), 1);
        let mut out = Vec::new();
        worker.finish_step(&mut out);
        let (_, rest) = run(&mut worker);
        out.extend(rest);
        assert!(out.iter().all(|o| o.request == 2), "{out:?}");
        assert_eq!(out.iter().filter(|o| o.token).count(), 3);
        assert_eq!(worker.requests(), 0);
        assert_eq!(worker.metrics().kv_active_blocks, 0);
    }

    #[test]
    fn imported_blocks_are_cached_for_the_next_request() {
        let args = MockerArgs { block_size: 4, ..Default::default() };
        let mut cold = SimWorker::new(args.clone(), 1.0).unwrap();
        cold.add(1, (0..42).collect(), 2).unwrap();
        let (cold_ms, _) = run(&mut cold);
        let mut warm = SimWorker::new(args, 1.0).unwrap();
        assert_eq!(warm.import_kv(&(0..42).collect::<Vec<u32>>()), 10, "the 10 full blocks");
        warm.add(1, (0..42).collect(), 2).unwrap();
        let (warm_ms, out) = run(&mut warm);
        assert_eq!(warm.prefix_blocks(), (10, 10));
        assert_eq!(out.iter().filter(|o| o.token).count(), 2);
        assert!(warm_ms < cold_ms, "{warm_ms} vs {cold_ms}");
    }
}

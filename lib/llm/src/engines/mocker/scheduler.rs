//! The simulated engine's scheduler: a waiting queue and a running batch, stepped like
//! vLLM. Each step schedules the running sequences first (a decode counts 1 token, a
//! prefill chunk its new tokens, within `max_num_batched_tokens`), growing their KV
//! blocks and preempting the most recently admitted sequence when blocks run out; then
//! admits waiting sequences while `max_num_seqs`, the token budget and the block
//! watermark allow. After the step's simulated time, every sequence whose tokens are
//! all computed samples one token.
//!
//! [`Scheduler::schedule`] and [`Scheduler::apply`] are synchronous (tests step them by
//! hand); [`Scheduler::run`] is the async loop the engine spawns.

use std::collections::VecDeque;

use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::args::MockerArgs;
use crate::kv_router::protocols::BlockHash;
use super::kv_manager::{KvManager, OutOfBlocks};
use crate::kv_router::protocols::ForwardPassMetrics;
use super::publisher::EventSink;
use super::sequence::{HeldBlock, OutputSender, Sequence};
use super::timing::{step_duration, StepWork};
use crate::engine::EngineError;
use crate::protocols::common::{FinishReason, LLMEngineOutput};

/// A request handed to the scheduler.
#[derive(Debug)]
pub(crate) struct NewRequest {
    /// Engine-wide unique id.
    pub(crate) id: u64,
    /// Prompt token ids.
    pub(crate) tokens: Vec<u32>,
    /// Tokens to generate.
    pub(crate) max_tokens: usize,
    /// Seed of the generated token ids.
    pub(crate) seed: u64,
    /// Receives the output items.
    pub(crate) output: OutputSender,
}

/// What the engine tells the scheduler.
#[derive(Debug)]
pub(crate) enum Command {
    /// Queue a request.
    Add(NewRequest),
    /// Drop a request (stopped, killed or its stream dropped) and free its blocks.
    Cancel(u64),
    /// Answer how many leading blocks of this chain are cached.
    CachedPrefix {
        /// Chained block hashes of a prompt, in order.
        hashes: Vec<u64>,
        /// Receives the count.
        reply: oneshot::Sender<usize>,
    },
    /// Store blocks computed elsewhere (a disaggregated prefill) as cached ones.
    Import {
        /// The blocks, in prompt order.
        hashes: Vec<BlockHash>,
        /// Receives how many leading blocks are now cached.
        reply: oneshot::Sender<usize>,
    },
}

/// One sequence's share of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Scheduled {
    /// The sequence.
    pub(crate) id: u64,
    /// Tokens computed for it in this step.
    pub(crate) tokens: usize,
}

/// The work of one step.
#[derive(Debug, Default)]
pub(crate) struct StepPlan {
    /// Sequences in the step, in batch order.
    pub(crate) scheduled: Vec<Scheduled>,
    /// What the timing model charges for.
    pub(crate) work: StepWork,
}

/// The scheduler's state.
#[derive(Debug)]
pub(crate) struct Scheduler {
    args: MockerArgs,
    pub(crate) kv: KvManager,
    pub(crate) waiting: VecDeque<Sequence>,
    /// In admission order: the last one is preempted first.
    pub(crate) running: Vec<Sequence>,
    prefix_blocks_queried: u64,
    prefix_blocks_hit: u64,
    /// Preemptions so far.
    pub(crate) preemptions: u64,
}

impl Scheduler {
    /// An idle scheduler over an empty cache.
    pub(crate) fn new(args: MockerArgs) -> Self {
        Scheduler {
            kv: KvManager::new(args.num_gpu_blocks),
            args,
            waiting: VecDeque::new(),
            running: Vec::new(),
            prefix_blocks_queried: 0,
            prefix_blocks_hit: 0,
            preemptions: 0,
        }
    }

    /// Apply a command.
    pub(crate) fn handle(&mut self, command: Command) {
        match command {
            Command::Add(req) => self.waiting.push_back(Sequence::new(
                req.id,
                req.tokens,
                self.args.block_size,
                req.max_tokens,
                req.seed,
                req.output,
            )),
            Command::Cancel(id) => {
                self.waiting.retain(|s| s.id != id);
                if let Some(pos) = self.running.iter().position(|s| s.id == id) {
                    let seq = self.running.remove(pos);
                    self.release(seq);
                }
            }
            Command::CachedPrefix { hashes, reply } => {
                let _ = reply.send(self.cached_prefix_blocks(&hashes));
            }
            Command::Import { hashes, reply } => {
                let _ = reply.send(self.import(&hashes));
            }
        }
    }

    /// How many leading blocks of the chained block hashes `hashes` are cached (in use
    /// or not).
    pub(crate) fn cached_prefix_blocks(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.kv.is_cached(**h)).count()
    }

    /// Put full blocks computed elsewhere into the cache, unused (evictable), as if
    /// they had been computed here: `stored` events go out for the new ones. Stops at
    /// the first block that finds no room; returns how many leading blocks are cached.
    pub(crate) fn import(&mut self, hashes: &[BlockHash]) -> usize {
        if !self.args.enable_prefix_caching {
            return 0;
        }
        let mut parent = None;
        for (i, hash) in hashes.iter().enumerate() {
            if self.kv.acquire_full(*hash, parent).is_err() {
                return i;
            }
            self.kv.release_full(hash.block_hash);
            parent = Some(hash.block_hash);
        }
        hashes.len()
    }

    /// Whether there is nothing to do.
    pub(crate) fn is_idle(&self) -> bool {
        self.running.is_empty() && self.waiting.is_empty()
    }

    /// Choose the next step's batch and allocate its blocks.
    pub(crate) fn schedule(&mut self) -> StepPlan {
        let mut plan = StepPlan::default();
        let mut budget = self.args.max_num_batched_tokens;
        self.schedule_running(&mut plan, &mut budget);
        self.admit_waiting(&mut plan, &mut budget);
        plan.work.active_blocks = self.kv.active_blocks();
        plan
    }

    fn schedule_running(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let mut tokens = self.running[i].uncomputed();
            if tokens > *budget {
                if !self.args.enable_chunked_prefill {
                    i += 1;
                    continue;
                }
                tokens = *budget;
            }
            // Grow this sequence's blocks, preempting from the back until it fits or
            // it was preempted itself.
            while self.grow(i, tokens).is_err() {
                let victim = self.running.len() - 1;
                self.preempt(victim);
                if victim == i {
                    break;
                }
            }
            if i >= self.running.len() {
                break;
            }
            self.plan_chunk(plan, i, tokens);
            *budget -= tokens;
            i += 1;
        }
    }

    fn admit_waiting(&mut self, plan: &mut StepPlan, budget: &mut usize) {
        let block_size = self.args.block_size;
        let watermark = self.args.watermark_blocks();
        while *budget > 0 && self.running.len() < self.args.max_num_seqs {
            let Some(seq) = self.waiting.front() else { break };
            if let Some(reason) = self.never_fits(seq) {
                if let Some(seq) = self.waiting.pop_front() {
                    self.finish_unservable(seq, reason);
                }
                continue;
            }
            let cached = if self.args.enable_prefix_caching {
                seq.hashes().iter().take_while(|h| self.kv.is_cached(h.block_hash)).count()
            } else {
                0
            };
            // At least the last token is computed, to sample from it.
            let hit_blocks = cached.min((seq.len() - 1) / block_size);
            let active_hits = seq.hashes()[..hit_blocks].iter().filter(|h| self.kv.is_active(h.block_hash)).count();
            let needed = seq.blocks_for(seq.len() + 1) - active_hits;
            if needed + watermark > self.kv.available_blocks() {
                break;
            }
            let mut tokens = seq.len() - hit_blocks * block_size;
            if tokens > *budget {
                if !self.args.enable_chunked_prefill {
                    break;
                }
                tokens = *budget;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            self.prefix_blocks_queried += seq.hashes().len() as u64;
            self.prefix_blocks_hit += cached as u64;
            let mut parent = None;
            for hash in &seq.hashes()[..hit_blocks] {
                // Cached blocks need no free block.
                if self.kv.acquire_full(*hash, parent).is_err() {
                    tracing::error!("a cached block could not be reused");
                }
                parent = Some(hash.block_hash);
            }
            let hits: Vec<HeldBlock> = seq.hashes()[..hit_blocks].iter().map(|h| HeldBlock::Full(h.block_hash)).collect();
            seq.held.extend(hits);
            seq.computed = hit_blocks * block_size;
            seq.cached_tokens.get_or_insert(u32::try_from(seq.computed).unwrap_or(u32::MAX));
            self.running.push(seq);
            let i = self.running.len() - 1;
            if self.grow(i, tokens).is_err() {
                // The watermark check above makes this unreachable; undo the admission.
                self.preempt(i);
                break;
            }
            self.plan_chunk(plan, i, tokens);
            *budget -= tokens;
        }
    }

    /// Why the sequence can never run, if so.
    fn never_fits(&self, seq: &Sequence) -> Option<String> {
        let usable = self.args.num_gpu_blocks - self.args.watermark_blocks();
        if seq.blocks_for(seq.len() + 1) > usable {
            return Some(format!(
                "sequence of {} tokens needs more than the {usable} usable KV blocks of {} tokens",
                seq.len(),
                self.args.block_size
            ));
        }
        if !self.args.enable_chunked_prefill && seq.len() > self.args.max_num_batched_tokens {
            return Some(format!(
                "sequence of {} tokens exceeds max_num_batched_tokens ({}) without chunked prefill",
                seq.len(),
                self.args.max_num_batched_tokens
            ));
        }
        None
    }

    /// End a sequence that cannot be served: `length` if it already generated tokens
    /// (it outgrew the cache), else an error.
    fn finish_unservable(&mut self, seq: Sequence, reason: String) {
        let item = if seq.generated() > 0 {
            tracing::warn!(id = seq.id, %reason, "ending a sequence that no longer fits");
            Ok(LLMEngineOutput { finish_reason: Some(FinishReason::Length), ..Default::default() })
        } else {
            Err(EngineError::BadRequest(reason))
        };
        let _ = seq.output.send(item);
        self.release(seq);
    }

    /// Hold enough blocks for `tokens` more computed tokens of `running[i]`.
    fn grow(&mut self, i: usize, tokens: usize) -> Result<(), OutOfBlocks> {
        let seq = &mut self.running[i];
        let needed = seq.blocks_for(seq.computed + tokens);
        while seq.held.len() < needed {
            self.kv.acquire_private()?;
            seq.held.push(HeldBlock::Private);
        }
        Ok(())
    }

    fn plan_chunk(&self, plan: &mut StepPlan, i: usize, tokens: usize) {
        let seq = &self.running[i];
        plan.scheduled.push(Scheduled { id: seq.id, tokens });
        if seq.generated() > 0 && tokens == 1 {
            plan.work.decoding_seqs += 1;
        } else {
            plan.work.prefill_chunks.push((tokens, seq.computed));
        }
    }

    /// Free `running[i]`'s blocks and put it back at the front of the queue; its
    /// tokens so far are recomputed when it is admitted again.
    fn preempt(&mut self, i: usize) {
        let mut seq = self.running.remove(i);
        tracing::debug!(id = seq.id, tokens = seq.len(), "preempting");
        self.preemptions += 1;
        self.free_blocks(&mut seq);
        seq.computed = 0;
        self.waiting.push_front(seq);
    }

    fn release(&mut self, mut seq: Sequence) {
        self.free_blocks(&mut seq);
    }

    /// Give back a sequence's blocks, last first, so that a prefix outlives its tails
    /// in the LRU order.
    fn free_blocks(&mut self, seq: &mut Sequence) {
        for block in seq.held.drain(..).rev() {
            match block {
                HeldBlock::Full(hash) => self.kv.release_full(hash),
                HeldBlock::Private => self.kv.release_private(),
            }
        }
    }

    /// Account the step as done: advance computed tokens, turn computed full blocks
    /// into cached ones, sample a token for every sequence that is fully computed and
    /// finish the ones at `max_tokens` (or whose receiver is gone).
    pub(crate) fn apply(&mut self, plan: &StepPlan) {
        let mut finished = Vec::new();
        // The plan lists running sequences in their batch order: find each one by
        // walking forward (a full search only if the batch changed since).
        let mut next = 0;
        for step in &plan.scheduled {
            let found = self.running[next..].iter().position(|s| s.id == step.id).map(|p| p + next);
            let Some(i) = found.or_else(|| self.running.iter().position(|s| s.id == step.id)) else { continue };
            next = i + 1;
            let seq = &mut self.running[i];
            let before = seq.computed;
            seq.computed += step.tokens;
            if self.args.enable_prefix_caching {
                let end = (seq.computed / self.args.block_size).min(seq.hashes().len());
                for b in before / self.args.block_size..end {
                    if seq.held[b] == HeldBlock::Private {
                        let hash = seq.hashes()[b];
                        let parent = b.checked_sub(1).map(|p| seq.hashes()[p].block_hash);
                        self.kv.promote(hash, parent);
                        seq.held[b] = HeldBlock::Full(hash.block_hash);
                    }
                }
            }
            if seq.uncomputed() > 0 {
                continue;
            }
            let token = seq.sample();
            let done = seq.is_done();
            let item = LLMEngineOutput {
                token_ids: vec![token],
                finish_reason: done.then_some(FinishReason::Length),
                cached_tokens: if done { seq.cached_tokens } else { None },
                ..Default::default()
            };
            let delivered = seq.output.send(Ok(item)).is_ok();
            if done || !delivered {
                finished.push(step.id);
            }
        }
        if finished.is_empty() {
            return;
        }
        let (done, still): (Vec<Sequence>, Vec<Sequence>) =
            std::mem::take(&mut self.running).into_iter().partition(|s| finished.contains(&s.id));
        self.running = still;
        for seq in done {
            self.release(seq);
        }
    }

    /// Prompt blocks looked up in the prefix cache at admission, and those found.
    pub(crate) fn prefix_counts(&self) -> (u64, u64) {
        (self.prefix_blocks_queried, self.prefix_blocks_hit)
    }

    /// The current load.
    pub(crate) fn metrics(&self) -> ForwardPassMetrics {
        let total = self.kv.capacity() as u64;
        let active = self.kv.active_blocks() as u64;
        let hit_rate = if self.prefix_blocks_queried == 0 {
            0.0
        } else {
            self.prefix_blocks_hit as f32 / self.prefix_blocks_queried as f32
        };
        ForwardPassMetrics {
            data_parallel_rank: self.args.data_parallel_rank,
            request_active_slots: self.running.len() as u64,
            request_total_slots: self.args.max_num_seqs as u64,
            kv_active_blocks: active,
            kv_total_blocks: total,
            num_requests_waiting: self.waiting.len() as u64,
            gpu_cache_usage_perc: active as f32 / total as f32,
            gpu_prefix_cache_hit_rate: hit_rate,
        }
    }

    /// Hand queued KV events and the current metrics to their channels.
    fn publish(&mut self, events: &mut EventSink, metrics: &watch::Sender<ForwardPassMetrics>) {
        for data in self.kv.take_events() {
            events.send(data);
        }
        let now = self.metrics();
        metrics.send_if_modified(|m| {
            if *m == now {
                return false;
            }
            *m = now;
            true
        });
    }

    /// Step until cancelled or every command sender is gone; on exit, the requests
    /// still queued or running get an error item.
    pub(crate) async fn run(
        mut self,
        mut commands: mpsc::UnboundedReceiver<Command>,
        mut events: EventSink,
        metrics: watch::Sender<ForwardPassMetrics>,
        cancel: CancellationToken,
    ) {
        'steps: loop {
            while let Ok(command) = commands.try_recv() {
                self.handle(command);
            }
            self.publish(&mut events, &metrics);
            let plan = if self.is_idle() { StepPlan::default() } else { self.schedule() };
            if plan.scheduled.is_empty() {
                self.publish(&mut events, &metrics);
                tokio::select! {
                    _ = cancel.cancelled() => break 'steps,
                    command = commands.recv() => match command {
                        Some(command) => self.handle(command),
                        None => break 'steps,
                    },
                }
                continue;
            }
            self.publish(&mut events, &metrics);
            let duration = step_duration(&self.args, &plan.work);
            tokio::select! {
                _ = cancel.cancelled() => break 'steps,
                _ = tokio::time::sleep(duration) => {}
            }
            if duration.is_zero() {
                tokio::task::yield_now().await;
            }
            self.apply(&plan);
        }
        let shutdown = || Err(EngineError::Unavailable("mocker engine shut down".to_string()));
        for seq in self.running.drain(..).chain(self.waiting.drain(..)) {
            let _ = seq.output.send(shutdown());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_router::protocols::KvCacheEventData;

    type Receiver = mpsc::UnboundedReceiver<Result<LLMEngineOutput, EngineError>>;

    fn args(json: &str) -> MockerArgs {
        MockerArgs::from_json(json).unwrap()
    }

    fn add(s: &mut Scheduler, id: u64, tokens: Vec<u32>, max_tokens: usize) -> Receiver {
        let (output, rx) = mpsc::unbounded_channel();
        s.handle(Command::Add(NewRequest { id, tokens, max_tokens, seed: id, output }));
        rx
    }

    fn step(s: &mut Scheduler) -> StepPlan {
        let plan = s.schedule();
        s.apply(&plan);
        plan
    }

    /// Step until idle (bounded); returns the number of steps.
    fn run_to_idle(s: &mut Scheduler) -> usize {
        for n in 0..10_000 {
            if s.is_idle() {
                return n;
            }
            step(s);
        }
        panic!("scheduler did not finish");
    }

    /// All items of a finished request.
    fn drain(rx: &mut Receiver) -> Vec<LLMEngineOutput> {
        let mut out = Vec::new();
        while let Ok(item) = rx.try_recv() {
            out.push(item.unwrap());
        }
        out
    }

    #[test]
    fn max_num_seqs_is_respected() {
        let mut s = Scheduler::new(args(r#"{"max_num_seqs": 2}"#));
        let mut rxs: Vec<Receiver> = (0..5).map(|i| add(&mut s, i, vec![i as u32; 20], 3)).collect();
        let plan = step(&mut s);
        assert_eq!(plan.scheduled.len(), 2);
        assert_eq!((s.running.len(), s.waiting.len()), (2, 3));
        let m = s.metrics();
        assert_eq!((m.request_active_slots, m.request_total_slots, m.num_requests_waiting), (2, 2, 3));
        while !s.is_idle() {
            assert!(step(&mut s).scheduled.len() <= 2);
        }
        for rx in &mut rxs {
            assert_eq!(drain(rx).len(), 3);
        }
        assert_eq!(s.kv.active_blocks(), 0);
    }

    #[test]
    fn chunked_prefill_splits_a_long_prompt() {
        let mut s = Scheduler::new(args(r#"{"max_num_batched_tokens": 64, "block_size": 16}"#));
        let mut rx = add(&mut s, 1, (0..200).collect(), 2);
        let chunks: Vec<usize> = (0..4).map(|_| step(&mut s).scheduled[0].tokens).collect();
        assert_eq!(chunks, vec![64, 64, 64, 8]);
        let out = drain(&mut rx);
        assert_eq!(out.len(), 1, "the first token comes with the last chunk");
        let plan = step(&mut s);
        assert_eq!((plan.work.decoding_seqs, plan.work.prefill_chunks.len()), (1, 0));
        assert_eq!(drain(&mut rx)[0].finish_reason, Some(FinishReason::Length));
    }

    #[test]
    fn stored_events_follow_computed_chunks() {
        let mut s = Scheduler::new(args(r#"{"max_num_batched_tokens": 32, "block_size": 16}"#));
        let _rx = add(&mut s, 1, (0..70).collect(), 1);
        step(&mut s);
        let first = s.kv.take_events();
        let KvCacheEventData::Stored(data) = &first[0] else { panic!("{first:?}") };
        assert_eq!((data.parent_hash, data.blocks.len()), (None, 2));
        step(&mut s);
        let second = s.kv.take_events();
        let KvCacheEventData::Stored(next) = &second[0] else { panic!("{second:?}") };
        assert_eq!(next.parent_hash, Some(data.blocks[1].block_hash));
        assert_eq!(next.blocks.len(), 2);
    }

    #[test]
    fn non_chunked_prompt_over_budget_fails() {
        let mut s = Scheduler::new(args(r#"{"max_num_batched_tokens": 64, "enable_chunked_prefill": false}"#));
        let mut rx = add(&mut s, 1, (0..100).collect(), 2);
        step(&mut s);
        assert!(matches!(rx.try_recv(), Ok(Err(EngineError::BadRequest(_)))));
        assert!(s.is_idle());
    }

    #[test]
    fn prefix_hit_skips_cached_blocks() {
        let mut s = Scheduler::new(args(r#"{"block_size": 16}"#));
        let prefix: Vec<u32> = (0..64).collect(); // 4 blocks
        let mut a = prefix.clone();
        a.extend([1000, 1001]);
        let mut ra = add(&mut s, 1, a, 1);
        run_to_idle(&mut s);
        let first = ra.try_recv().unwrap().unwrap();
        assert_eq!((first.finish_reason.is_some(), first.cached_tokens), (true, Some(0)), "{first:?}");
        assert_eq!(s.kv.active_blocks(), 0);
        assert_eq!(s.kv.inactive_blocks(), 4, "the finished prompt's full blocks stay cached");
        s.kv.take_events();
        let mut b = prefix.clone();
        b.extend(2000..2040); // 2 new full blocks + 8 tokens
        let mut rb = add(&mut s, 2, b, 1);
        let plan = s.schedule();
        assert_eq!(plan.scheduled[0].tokens, 40, "only the uncached tokens are computed");
        assert_eq!(plan.work.prefill_chunks, vec![(40, 64)]);
        assert_eq!(s.kv.active_blocks(), 7, "4 reused + 3 new");
        s.apply(&plan);
        let events = s.kv.take_events();
        let KvCacheEventData::Stored(data) = &events[0] else { panic!("{events:?}") };
        assert_eq!(data.blocks.len(), 2);
        assert_eq!(s.metrics().gpu_prefix_cache_hit_rate, 4.0 / 10.0);
        // Its last output reports the cached prefix, as vLLM's num_cached_tokens does.
        let last = rb.try_recv().unwrap().unwrap();
        assert_eq!((last.finish_reason.is_some(), last.cached_tokens), (true, Some(64)), "{last:?}");
    }

    #[test]
    fn preemption_when_blocks_run_out() {
        let mut s = Scheduler::new(args(r#"{"block_size": 4, "num_gpu_blocks": 8, "watermark": 0}"#));
        let mut ra = add(&mut s, 1, (0..12).collect(), 10);
        let mut rb = add(&mut s, 2, (100..112).collect(), 10);
        let mut preempted_b = false;
        for _ in 0..100 {
            if s.is_idle() {
                break;
            }
            step(&mut s);
            if s.waiting.front().is_some_and(|w| w.id == 2) && s.running.iter().any(|r| r.id == 1) {
                let b = &s.waiting[0];
                assert_eq!((b.computed, b.held.len()), (0, 0), "a preempted sequence holds no blocks");
                preempted_b = true;
            }
            assert!(s.kv.active_blocks() <= 8);
        }
        assert!(preempted_b, "the most recently admitted sequence was preempted");
        assert!(s.preemptions > 0 && s.is_idle());
        for rx in [&mut ra, &mut rb] {
            let out = drain(rx);
            assert_eq!(out.len(), 10);
            assert_eq!(out[9].finish_reason, Some(FinishReason::Length));
        }
    }

    #[test]
    fn watermark_holds_back_admission() {
        let json = r#"{"block_size": 4, "num_gpu_blocks": 100, "watermark": 0.1}"#;
        let mut s = Scheduler::new(args(json));
        let _ra = add(&mut s, 1, (0..320).collect(), 2); // 80 blocks
        let _rb = add(&mut s, 2, (1000..1040).collect(), 2); // needs 11 of the 20 left
        s.schedule();
        assert_eq!((s.running.len(), s.waiting.len()), (1, 1), "20 - 11 < 10 watermark blocks");
        let mut s = Scheduler::new(args(r#"{"block_size": 4, "num_gpu_blocks": 100, "watermark": 0}"#));
        let _ra = add(&mut s, 1, (0..320).collect(), 2);
        let _rb = add(&mut s, 2, (1000..1040).collect(), 2);
        s.schedule();
        assert_eq!(s.running.len(), 2);
    }

    #[test]
    fn cancel_frees_blocks() {
        let mut s = Scheduler::new(args(r#"{"block_size": 4}"#));
        let _rx = add(&mut s, 1, (0..30).collect(), 100);
        step(&mut s);
        step(&mut s);
        assert!(s.kv.active_blocks() > 0);
        s.handle(Command::Cancel(1));
        assert!(s.is_idle());
        assert_eq!(s.kv.active_blocks(), 0);
        assert_eq!(s.kv.inactive_blocks(), 7, "its computed full blocks stay cached");
    }

    #[test]
    fn a_dropped_receiver_ends_the_sequence() {
        let mut s = Scheduler::new(args("{}"));
        drop(add(&mut s, 1, (0..30).collect(), 100));
        step(&mut s);
        assert!(s.is_idle());
        assert_eq!(s.kv.active_blocks(), 0);
    }

    #[test]
    fn prefix_caching_off_shares_nothing() {
        let mut s = Scheduler::new(args(r#"{"block_size": 4, "enable_prefix_caching": false}"#));
        let _ra = add(&mut s, 1, (0..16).collect(), 1);
        run_to_idle(&mut s);
        let _rb = add(&mut s, 2, (0..16).collect(), 1);
        let plan = s.schedule();
        assert_eq!(plan.scheduled[0].tokens, 16);
        assert!(s.kv.take_events().is_empty());
        assert_eq!(s.kv.inactive_blocks(), 0);
    }
}

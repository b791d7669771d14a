//! [`KvRouter`]: hashes a request's tokens into blocks, finds each live worker's
//! overlap in the [`RadixTree`], lets the [`LoadTracker`] choose from overlap and load
//! (see [`super::scheduler`]), and records the choice as the chosen worker's predicted
//! cache contents (expiring after a TTL); the workers' KV events, when followed, confirm
//! and correct them (evicted blocks stop counting), and their load metrics, when
//! followed, correct the load. Routers of the same workers share their decisions
//! ([`super::replica`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dynamo_runtime::component::Component;
use dynamo_runtime::events::Subscription;
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;

use super::inflight::{InflightGuard, InflightTracker};
use super::protocols::{compute_block_hash_for_seq, LoadMetricsEvent, RouterEvent, KV_EVENTS_SUBJECT, LOAD_METRICS_SUBJECT};
use super::radix::{RadixTree, SnapshotBlock};
use super::replica::{self, ReplicaHost, ReplicaState, SyncMessage};
use super::scheduler::{new_blocks, LoadTracker, ScheduleError, SchedulerConfig};
use super::ttft::{combine, Aggregate};

/// Default tokens per KV-cache block, when the model does not say.
pub const DEFAULT_BLOCK_SIZE: u32 = 16;
/// Default lifetime of a predicted block.
pub const DEFAULT_TTL: Duration = Duration::from_secs(120);
/// Default cap on predicted blocks per worker.
pub const DEFAULT_MAX_BLOCKS_PER_WORKER: usize = 65_536;

/// Settings of a [`KvRouter`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRouterConfig {
    /// Tokens per KV-cache block (the model's `kv_cache_block_size`); at least 1.
    pub block_size: u32,
    /// The cost function, temperature, busy threshold and straggler penalty.
    pub scheduler: SchedulerConfig,
    /// Whether the workers' KV events correct the index (`false`: approximate mode,
    /// predictions from routing decisions only).
    pub use_kv_events: bool,
    /// How long a predicted block is trusted after its last use.
    pub ttl: Duration,
    /// Most predicted blocks kept per worker (least recently used go first).
    pub max_blocks_per_worker: usize,
    /// Whether [`KvRouter::follow_component`] also shares decisions with the other
    /// routers of the same workers (see [`super::replica`]).
    pub replica_sync: bool,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        KvRouterConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            scheduler: SchedulerConfig::default(),
            use_kv_events: true,
            ttl: DEFAULT_TTL,
            max_blocks_per_worker: DEFAULT_MAX_BLOCKS_PER_WORKER,
            replica_sync: true,
        }
    }
}

impl KvRouterConfig {
    /// The defaults with this block size (`None` or 0: the default 16).
    pub fn with_block_size(block_size: Option<u32>) -> Self {
        KvRouterConfig { block_size: block_size.filter(|b| *b > 0).unwrap_or(DEFAULT_BLOCK_SIZE), ..Default::default() }
    }
}

/// Where a request goes, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvDecision {
    /// The chosen worker's instance id.
    pub worker: u64,
    /// Leading request blocks the worker was predicted to hold.
    pub overlap_blocks: usize,
    /// Full blocks in the request.
    pub request_blocks: usize,
    /// Prompt tokens the worker must compute: those not in its predicted prefix.
    pub prefill_tokens: u64,
    /// The id of its blocks in the load tracker's count of what was sent.
    pub sent: u64,
}

impl KvDecision {
    /// KV blocks the request adds on its worker: those it was not predicted to find
    /// there (the prompt's uncached full blocks, its partial block and what it decodes
    /// into, counted as one). Cached prefix blocks are shared, not added per request.
    pub fn new_blocks(&self) -> u64 {
        new_blocks(self.request_blocks, self.overlap_blocks)
    }
}

/// An approximate KV-cache-aware router over a set of workers. Shared by every
/// request to one model (`Arc`); thread safe.
#[derive(Debug)]
pub struct KvRouter {
    config: KvRouterConfig,
    index: Mutex<RadixTree>,
    inflight: InflightTracker,
    /// This router as one of several replicas (see [`super::replica`]).
    replica: Arc<ReplicaState>,
    /// Tasks following the workers' KV events and load metrics (see
    /// [`KvRouter::follow_events`], [`KvRouter::follow_metrics`]) and the other replicas.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for KvRouter {
    fn drop(&mut self) {
        for task in self.tasks.lock().drain(..) {
            task.abort();
        }
    }
}

impl KvRouter {
    /// A router with no predictions yet.
    pub fn new(config: KvRouterConfig) -> Arc<Self> {
        let block_size = config.block_size.max(1);
        Arc::new(KvRouter {
            config: KvRouterConfig { block_size, ..config },
            index: Mutex::new(RadixTree::with_prediction_limits(config.ttl, config.max_blocks_per_worker)),
            inflight: InflightTracker::new(Arc::new(Mutex::new(LoadTracker::new(config.scheduler)))),
            replica: Arc::new(ReplicaState::new()),
            tasks: Mutex::new(Vec::new()),
        })
    }

    /// Its settings.
    pub fn config(&self) -> &KvRouterConfig {
        &self.config
    }

    /// Choose among `live` workers for a prompt of `token_ids`, and record its blocks as
    /// held by the chosen worker. Workers not in `live` are forgotten. Fails when
    /// `live` is empty or every worker is busy.
    pub fn route(&self, token_ids: &[u32], live: &[u64]) -> Result<KvDecision, ScheduleError> {
        self.route_at(token_ids, live, Instant::now())
    }

    /// [`Self::route`] at time `now`.
    pub fn route_at(&self, token_ids: &[u32], live: &[u64], now: Instant) -> Result<KvDecision, ScheduleError> {
        self.route_with(token_ids, live, now, &mut rand::rng())
    }

    /// [`Self::route`] at time `now`, drawing from `rng` (ties, temperature).
    pub fn route_with(
        &self,
        token_ids: &[u32],
        live: &[u64],
        now: Instant,
        rng: &mut impl rand::Rng,
    ) -> Result<KvDecision, ScheduleError> {
        let hashes = compute_block_hash_for_seq(token_ids, self.config.block_size as usize);
        let mut index = self.index.lock();
        index.retain_workers(live);
        index.expire(now);
        let overlap = index.find_matches(&hashes);
        let overlaps: Vec<(u64, usize)> =
            live.iter().map(|&worker| (worker, overlap.scores.get(&worker).map_or(0, |&n| n as usize))).collect();
        let chosen = {
            let mut load = self.inflight.load().lock();
            load.retain(live);
            load.schedule(&overlaps, hashes.len(), now, rng)?
        };
        index.record_prediction(chosen.worker, &hashes, now);
        drop(index);
        let decision = KvDecision {
            worker: chosen.worker,
            overlap_blocks: chosen.overlap_blocks,
            request_blocks: hashes.len(),
            prefill_tokens: self.prefill_tokens(token_ids.len(), chosen.overlap_blocks),
            sent: chosen.sent,
        };
        if self.replica.is_syncing() {
            self.replica.send(SyncMessage::Routed {
                replica: self.replica.id,
                request: decision.sent,
                worker: decision.worker,
                blocks: decision.new_blocks(),
                block_size: self.config.block_size,
                hashes,
            });
        }
        Ok(decision)
    }

    /// Prompt tokens of a prompt of `tokens` that a worker holding `overlap_blocks` of
    /// its leading blocks must compute.
    fn prefill_tokens(&self, tokens: usize, overlap_blocks: usize) -> u64 {
        tokens.saturating_sub(overlap_blocks.saturating_mul(self.config.block_size as usize)) as u64
    }

    /// The router's estimate of the time to first token of a prompt of `token_ids` on
    /// the best of the `live` workers: each worker's prefill work waiting plus the
    /// prompt's tokens not in its predicted prefix, at its observed rate, or its wait for
    /// KV room behind the requests queued there when longer
    /// ([`super::ttft`]), and at least the wait of its oldest request without a first
    /// item. `None` while a live worker has no timed first item.
    pub fn ttft_estimate(&self, token_ids: &[u32], live: &[u64], now: Instant) -> Option<Duration> {
        let hashes = compute_block_hash_for_seq(token_ids, self.config.block_size as usize);
        let overlap = {
            let mut index = self.index.lock();
            index.expire(now);
            index.find_matches(&hashes)
        };
        let load = self.inflight.load().lock();
        let estimates = live.iter().map(|worker| {
            let cached = overlap.scores.get(worker).map_or(0, |&n| n as usize);
            load.ttft_estimate(*worker, self.prefill_tokens(token_ids.len(), cached), now)
        });
        combine(estimates, Aggregate::Best)
    }

    /// Count a request in flight on `worker` until the guard is dropped.
    pub fn start_request(&self, worker: u64) -> InflightGuard {
        self.inflight.start(worker)
    }

    /// Count the request of `decision` in flight on its worker (with its blocks, the
    /// load of a worker that publishes no metrics) until the guard is dropped, when its
    /// blocks also stop counting in the worker's predicted load.
    pub fn start_decision(&self, decision: &KvDecision) -> InflightGuard {
        let guard = self
            .inflight
            .start_with_blocks(decision.worker, decision.new_blocks(), Some(decision.sent))
            .prefilling(decision.prefill_tokens);
        if !self.replica.is_syncing() {
            return guard;
        }
        let (replica, request) = (self.replica.clone(), decision.sent);
        guard.on_end(move || replica.send(SyncMessage::Ended { replica: replica.id, request }))
    }

    /// Follow the workers of `component`: their KV events (when the config uses them),
    /// their load metrics, and the other routers of the same workers (when the config
    /// syncs replicas).
    pub async fn follow_component(self: &Arc<Self>, component: &Component) -> dynamo_runtime::Result<()> {
        if self.config.use_kv_events {
            self.follow_events(component.subscribe(KV_EVENTS_SUBJECT).await?);
        }
        self.follow_metrics(component.subscribe(LOAD_METRICS_SUBJECT).await?);
        if self.config.replica_sync {
            self.sync_replicas(component).await?;
        }
        Ok(())
    }

    /// Share this router's decisions with the other routers of `component`'s workers on
    /// its event plane, and start from a peer's snapshot (see [`super::replica`]). Idempotent.
    pub async fn sync_replicas(self: &Arc<Self>, component: &Component) -> dynamo_runtime::Result<()> {
        replica::start(self, component).await
    }

    /// This router's id among replicas.
    pub fn replica_id(&self) -> u64 {
        self.replica.id
    }

    /// `(peer, blocks)` once a peer's snapshot has been restored in full.
    pub fn snapshot_restored(&self) -> Option<(u64, usize)> {
        self.replica.snapshot_restored()
    }

    /// The index as a new replica restores it ([`RadixTree::snapshot`]).
    pub fn snapshot(&self, now: Instant) -> Vec<SnapshotBlock> {
        let mut index = self.index.lock();
        index.expire(now);
        index.snapshot(now)
    }

    /// Merge a peer's snapshot into the index ([`RadixTree::restore`]).
    pub fn restore(&self, blocks: &[SnapshotBlock], now: Instant) {
        self.index.lock().restore(blocks, now);
    }

    /// The load and timing the router tracks.
    pub fn load(&self) -> &Arc<Mutex<LoadTracker>> {
        self.inflight.load()
    }

    /// A worker's load metrics (as published on `load_metrics`).
    pub fn apply_metrics(&self, event: &LoadMetricsEvent) {
        self.inflight.load().lock().update_metrics(event.worker_id, &event.metrics, Instant::now());
    }

    /// Feed the load metrics of `subscription` (the workers' `load_metrics` subject)
    /// into this router until it is dropped or the subscription ends.
    pub fn follow_metrics(self: &Arc<Self>, subscription: Subscription) {
        self.follow(subscription, "load metrics", KvRouter::apply_metrics);
    }

    /// Requests in flight on `worker`.
    pub fn inflight(&self, worker: u64) -> usize {
        self.inflight.get(worker)
    }

    /// Reconcile the index with a worker's KV event (as engines publish them on
    /// `kv_events`): stored blocks are held from now on, removed ones no longer are,
    /// `cleared` forgets the worker's blocks. Predictions from routing decisions stay in
    /// between, so a request that follows another before its events arrive still finds
    /// its prefix.
    pub fn apply_event(&self, event: &RouterEvent) {
        self.index.lock().apply_router_event(event);
    }

    /// Feed the KV events of `subscription` (the workers' `kv_events` subject) into this
    /// router until it is dropped or the subscription ends. The task holds only a weak
    /// reference and is aborted when the router is dropped.
    pub fn follow_events(self: &Arc<Self>, subscription: Subscription) {
        self.follow(subscription, "KV event", KvRouter::apply_event);
    }

    /// Feed each payload of `subscription`, parsed as a `T`, to `apply` on a task that
    /// holds only a weak reference (aborted when the router is dropped) and ends with the
    /// subscription; a malformed payload is logged and skipped.
    fn follow<T: DeserializeOwned + Send + 'static>(
        self: &Arc<Self>,
        subscription: Subscription,
        what: &'static str,
        apply: fn(&KvRouter, &T),
    ) {
        let weak = Arc::downgrade(self);
        let task = super::spawn_follow(subscription, what, move |item: T| match weak.upgrade() {
            Some(router) => {
                apply(&router, &item);
                true
            }
            None => false,
        });
        self.tasks.lock().push(task);
    }

    /// Forget what `worker` was predicted to hold (it is gone).
    pub fn remove_worker(&self, worker: u64) {
        self.index.lock().remove_worker(worker);
        self.inflight.load().lock().remove_worker(worker);
    }

    /// Leading blocks of `token_ids` that `worker` is predicted to hold now.
    pub fn predicted_overlap(&self, worker: u64, token_ids: &[u32]) -> usize {
        let hashes = compute_block_hash_for_seq(token_ids, self.config.block_size as usize);
        let mut index = self.index.lock();
        index.expire(Instant::now());
        index.find_matches(&hashes).scores.get(&worker).map_or(0, |&n| n as usize)
    }
}

impl ReplicaHost for KvRouter {
    fn replica(&self) -> &Arc<ReplicaState> {
        &self.replica
    }

    fn block_size(&self) -> u32 {
        self.config.block_size
    }

    /// A peer sent a request of `blocks` blocks to `worker` (with the tokens hashes of its
    /// prompt, when they use this router's block size): count it and predict its prefix
    /// there, as for this router's own decisions. Returns its id in the load tracker.
    fn apply_peer_decision(&self, worker: u64, blocks: u64, hashes: Option<&Vec<u64>>, now: Instant) -> u64 {
        if let Some(hashes) = hashes {
            self.index.lock().record_prediction(worker, hashes, now);
        }
        self.inflight.load().lock().record_peer_sent(worker, blocks, now)
    }

    fn forget_peer_decision(&self, worker: u64, sent: u64, blocks: u64, now: Instant) {
        self.load().lock().forget_sent(worker, sent, blocks, now);
    }

    fn snapshot(&self, now: Instant) -> Vec<SnapshotBlock> {
        KvRouter::snapshot(self, now)
    }

    fn restore(&self, blocks: &[SnapshotBlock], now: Instant) {
        KvRouter::restore(self, blocks, now)
    }

    fn add_tasks(&self, tasks: Vec<JoinHandle<()>>) {
        self.tasks.lock().extend(tasks);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prompt(first: u32, len: u32) -> Vec<u32> {
        (first..first + len).collect()
    }

    fn router() -> Arc<KvRouter> {
        KvRouter::new(KvRouterConfig::with_block_size(Some(4)))
    }

    #[test]
    fn a_shared_prefix_follows_its_worker() {
        let router = router();
        let a = prompt(0, 32);
        let first = router.route(&a, &[1, 2]).unwrap();
        assert_eq!((first.overlap_blocks, first.request_blocks), (0, 8));
        let mut longer = a.clone();
        longer.extend([900, 901, 902, 903]);
        let next = router.route(&longer, &[1, 2]).unwrap();
        assert_eq!((next.worker, next.overlap_blocks, next.request_blocks), (first.worker, 8, 9));
        // Now the whole longer prompt is predicted on that worker.
        for _ in 0..10 {
            let again = router.route(&longer, &[1, 2]).unwrap();
            assert_eq!((again.worker, again.overlap_blocks), (first.worker, 9));
        }
    }

    #[test]
    fn load_spreads_new_prefixes() {
        let router = router();
        let first = router.route(&prompt(0, 16), &[1, 2]).unwrap();
        let _busy = router.start_decision(&first);
        let second = router.route(&prompt(1000, 16), &[1, 2]).unwrap();
        assert_ne!(second.worker, first.worker);
    }

    #[test]
    fn vanished_workers_are_forgotten() {
        let router = router();
        let a = prompt(0, 16);
        let first = router.route(&a, &[1]).unwrap();
        assert_eq!(first.worker, 1);
        assert_eq!(router.predicted_overlap(1, &a), 4);
        let next = router.route(&a, &[2]).unwrap();
        assert_eq!((next.worker, next.overlap_blocks), (2, 0));
        assert_eq!(router.predicted_overlap(1, &a), 0);
        router.remove_worker(2);
        assert_eq!(router.predicted_overlap(2, &a), 0);
        assert_eq!(router.route(&a, &[]).unwrap_err(), ScheduleError::NoWorkers);
    }

    #[test]
    fn kv_events_correct_the_predictions() {
        use crate::kv_router::protocols::{
            hash_full_blocks, KvCacheEvent, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
            KvCacheStoredBlockData,
        };
        let r = router();
        let a = prompt(0, 16); // 4 blocks of 4
        let hashes = hash_full_blocks(&a, 4);
        let chain: Vec<u64> = hashes.iter().map(|b| b.block_hash).collect();
        let event = |data| RouterEvent { worker_id: 2, event: KvCacheEvent { event_id: 0, data } };
        // Worker 2 reports holding A's blocks: A's next request goes there.
        let blocks =
            hashes.iter().map(|h| KvCacheStoredBlockData { block_hash: h.block_hash, tokens_hash: h.tokens_hash }).collect();
        r.apply_event(&event(KvCacheEventData::Stored(KvCacheStoreData { parent_hash: None, blocks })));
        assert_eq!(r.predicted_overlap(2, &a), 4);
        // It evicts the second block: only the first still counts.
        r.apply_event(&event(KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: vec![chain[1]] })));
        assert_eq!(r.predicted_overlap(2, &a), 1);
        r.apply_event(&event(KvCacheEventData::Cleared));
        assert_eq!(r.predicted_overlap(2, &a), 0);
    }

    #[test]
    fn short_prompts_have_no_blocks() {
        let router = router();
        let d = router.route(&[1, 2, 3], &[5]).unwrap();
        assert_eq!((d.worker, d.request_blocks, d.overlap_blocks), (5, 0, 0));
        assert_eq!(KvRouterConfig::with_block_size(Some(0)).block_size, DEFAULT_BLOCK_SIZE);
    }

    #[test]
    fn the_ttft_estimate_counts_the_waiting_work_and_the_uncached_prompt() {
        let router = router();
        let now = Instant::now();
        let a = prompt(0, 32);
        assert_eq!(router.ttft_estimate(&a, &[1], now), None, "no worker timed yet");
        // Time worker 1 at 1 ms per prefill token: 100 tokens in 100 ms.
        let timed = router.load().lock().prefill_sent(1, 100, false, now);
        router.load().lock().prefill_first_item(1, timed, now, Duration::from_millis(100));
        assert_eq!(router.ttft_estimate(&a, &[1], now), Some(Duration::from_millis(32)));
        // A routed request of A waits until its first item: 32 tokens ahead of the next.
        let d = router.route_at(&a, &[1], now).unwrap();
        assert_eq!(d.prefill_tokens, 32);
        let guard = router.start_decision(&d);
        // The next A finds its 8 blocks predicted there: the waiting work is left, and
        // one unit of its own (a request costs at least one).
        assert_eq!(router.ttft_estimate(&a, &[1], now), Some(Duration::from_millis(33)));
        let b = prompt(1000, 16);
        assert_eq!(router.ttft_estimate(&b, &[1], now), Some(Duration::from_millis(48)));
        // Worker 2 has not been timed: nothing can be said.
        assert_eq!(router.ttft_estimate(&b, &[1, 2], now), None);
        drop(guard);
        assert_eq!(router.ttft_estimate(&b, &[1], now), Some(Duration::from_millis(16)), "no longer waiting");
    }
}

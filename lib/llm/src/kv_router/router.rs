//! [`KvRouter`]: hashes a request's tokens into blocks, scores the live workers with
//! the [`ApproxIndexer`]'s predicted overlap and the in-flight counts, and records the
//! choice as the chosen worker's new cache contents.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::indexer::ApproxIndexer;
use super::inflight::{InflightGuard, InflightTracker};
use super::selector::{select, Candidate, SelectorWeights};
use crate::mocker::hash_full_blocks;

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
    /// The selector's weights.
    pub weights: SelectorWeights,
    /// How long a predicted block is trusted after its last use.
    pub ttl: Duration,
    /// Most predicted blocks kept per worker (least recently used go first).
    pub max_blocks_per_worker: usize,
}

impl Default for KvRouterConfig {
    fn default() -> Self {
        KvRouterConfig {
            block_size: DEFAULT_BLOCK_SIZE,
            weights: SelectorWeights::default(),
            ttl: DEFAULT_TTL,
            max_blocks_per_worker: DEFAULT_MAX_BLOCKS_PER_WORKER,
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
}

/// An approximate KV-cache-aware router over a set of workers. Shared by every
/// request to one model (`Arc`); thread safe.
#[derive(Debug)]
pub struct KvRouter {
    config: KvRouterConfig,
    index: Mutex<ApproxIndexer>,
    inflight: InflightTracker,
}

impl KvRouter {
    /// A router with no predictions yet.
    pub fn new(config: KvRouterConfig) -> Arc<Self> {
        let block_size = config.block_size.max(1);
        Arc::new(KvRouter {
            config: KvRouterConfig { block_size, ..config },
            index: Mutex::new(ApproxIndexer::new(config.ttl, config.max_blocks_per_worker)),
            inflight: InflightTracker::default(),
        })
    }

    /// Its settings.
    pub fn config(&self) -> &KvRouterConfig {
        &self.config
    }

    /// Choose among `live` workers for a prompt of `token_ids`, and record its blocks as
    /// held by the chosen worker. Workers not in `live` are forgotten. `None` when
    /// `live` is empty.
    pub fn route(&self, token_ids: &[u32], live: &[u64]) -> Option<KvDecision> {
        self.route_at(token_ids, live, Instant::now())
    }

    /// [`Self::route`] at time `now`.
    pub fn route_at(&self, token_ids: &[u32], live: &[u64], now: Instant) -> Option<KvDecision> {
        let chain: Vec<u64> =
            hash_full_blocks(token_ids, self.config.block_size as usize).iter().map(|b| b.block_hash).collect();
        let mut index = self.index.lock();
        index.retain_workers(live);
        let candidates: Vec<Candidate> = live
            .iter()
            .map(|&worker| Candidate {
                worker,
                overlap_blocks: index.overlap(worker, &chain, now),
                inflight: self.inflight.get(worker),
            })
            .collect();
        let chosen = select(&candidates, chain.len(), self.config.weights, &mut rand::rng())?;
        index.record(chosen.worker, &chain, now);
        Some(KvDecision { worker: chosen.worker, overlap_blocks: chosen.overlap_blocks, request_blocks: chain.len() })
    }

    /// Count a request in flight on `worker` until the guard is dropped.
    pub fn start_request(&self, worker: u64) -> InflightGuard {
        self.inflight.start(worker)
    }

    /// Requests in flight on `worker`.
    pub fn inflight(&self, worker: u64) -> usize {
        self.inflight.get(worker)
    }

    /// Forget what `worker` was predicted to hold (it is gone).
    pub fn remove_worker(&self, worker: u64) {
        self.index.lock().remove_worker(worker);
    }

    /// Leading blocks of `token_ids` that `worker` is predicted to hold now.
    pub fn predicted_overlap(&self, worker: u64, token_ids: &[u32]) -> usize {
        let chain: Vec<u64> =
            hash_full_blocks(token_ids, self.config.block_size as usize).iter().map(|b| b.block_hash).collect();
        self.index.lock().overlap(worker, &chain, Instant::now())
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
        let _busy = router.start_request(first.worker);
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
        assert!(router.route(&a, &[]).is_none());
    }

    #[test]
    fn short_prompts_have_no_blocks() {
        let router = router();
        let d = router.route(&[1, 2, 3], &[5]).unwrap();
        assert_eq!((d.worker, d.request_blocks, d.overlap_blocks), (5, 0, 0));
        assert_eq!(KvRouterConfig::with_block_size(Some(0)).block_size, DEFAULT_BLOCK_SIZE);
    }
}

//! The approximate index: per worker, the chained block hashes it is predicted to hold
//! because the router sent it requests with those blocks. Each worker's set is an LRU,
//! bounded in size, whose entries expire after a TTL (the worker's real cache evicts
//! too; without events, old predictions are the least trustworthy).
//!
//! Methods take the current time as an argument so tests can drive the clock.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// Predicted blocks of one worker, in LRU order.
#[derive(Debug, Default)]
struct WorkerBlocks {
    /// Block hash → (sequence number of its last use, time of its last use).
    blocks: HashMap<u64, (u64, Instant)>,
    /// Sequence number → block hash; the first entry is the least recently used.
    order: BTreeMap<u64, u64>,
    next_seq: u64,
}

impl WorkerBlocks {
    fn touch(&mut self, hash: u64, now: Instant) {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Some((old_seq, _)) = self.blocks.insert(hash, (seq, now)) {
            self.order.remove(&old_seq);
        }
        self.order.insert(seq, hash);
    }

    fn pop_oldest(&mut self) {
        if let Some((_, hash)) = self.order.pop_first() {
            self.blocks.remove(&hash);
        }
    }

    /// Drop entries last used more than `ttl` before `now`, then the oldest beyond `cap`.
    /// Uses are recorded in time order, so expired entries are at the front.
    fn trim(&mut self, now: Instant, ttl: Duration, cap: usize) {
        while let Some((_, &hash)) = self.order.first_key_value() {
            let expired = self.blocks.get(&hash).is_none_or(|(_, at)| now.saturating_duration_since(*at) > ttl);
            if !expired {
                break;
            }
            self.pop_oldest();
        }
        while self.blocks.len() > cap {
            self.pop_oldest();
        }
    }

    fn holds(&self, hash: u64, now: Instant, ttl: Duration) -> bool {
        self.blocks.get(&hash).is_some_and(|(_, at)| now.saturating_duration_since(*at) <= ttl)
    }
}

/// Which blocks each worker is predicted to hold.
#[derive(Debug)]
pub struct ApproxIndexer {
    ttl: Duration,
    max_blocks_per_worker: usize,
    workers: HashMap<u64, WorkerBlocks>,
}

impl ApproxIndexer {
    /// An empty index whose entries expire after `ttl`, holding at most
    /// `max_blocks_per_worker` blocks per worker (at least 1).
    pub fn new(ttl: Duration, max_blocks_per_worker: usize) -> Self {
        ApproxIndexer { ttl, max_blocks_per_worker: max_blocks_per_worker.max(1), workers: HashMap::new() }
    }

    /// How many leading blocks of `chain` (chained block hashes, in order) `worker`
    /// holds: the walk stops at the first block it does not hold.
    pub fn overlap(&self, worker: u64, chain: &[u64], now: Instant) -> usize {
        let Some(blocks) = self.workers.get(&worker) else { return 0 };
        chain.iter().take_while(|hash| blocks.holds(**hash, now, self.ttl)).count()
    }

    /// Record that `worker` now holds the blocks of `chain` (refreshing their LRU
    /// position), then drop its expired entries and the oldest beyond the cap.
    pub fn record(&mut self, worker: u64, chain: &[u64], now: Instant) {
        let blocks = self.workers.entry(worker).or_default();
        for &hash in chain {
            blocks.touch(hash, now);
        }
        blocks.trim(now, self.ttl, self.max_blocks_per_worker);
    }

    /// Forget that `worker` holds `hashes` (it evicted them).
    pub fn remove_blocks(&mut self, worker: u64, hashes: &[u64]) {
        let Some(blocks) = self.workers.get_mut(&worker) else { return };
        for hash in hashes {
            if let Some((seq, _)) = blocks.blocks.remove(hash) {
                blocks.order.remove(&seq);
            }
        }
    }

    /// Forget `worker` entirely.
    pub fn remove_worker(&mut self, worker: u64) {
        self.workers.remove(&worker);
    }

    /// Forget every worker not in `live`.
    pub fn retain_workers(&mut self, live: &[u64]) {
        self.workers.retain(|id, _| live.contains(id));
    }

    /// Blocks predicted for `worker` (expired ones included until its next `record`).
    pub fn block_count(&self, worker: u64) -> usize {
        self.workers.get(&worker).map_or(0, |b| b.blocks.len())
    }

    /// The workers with an entry in the index, ascending.
    pub fn workers(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.workers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(120);

    #[test]
    fn overlap_counts_leading_blocks_and_stops_at_the_first_miss() {
        let now = Instant::now();
        let mut index = ApproxIndexer::new(TTL, 100);
        index.record(1, &[10, 11, 12], now);
        assert_eq!(index.overlap(1, &[10, 11, 12, 13], now), 3);
        assert_eq!(index.overlap(1, &[10, 11], now), 2);
        // A held block after a miss does not count.
        assert_eq!(index.overlap(1, &[10, 99, 12], now), 1);
        assert_eq!(index.overlap(1, &[99, 10], now), 0);
        assert_eq!(index.overlap(2, &[10], now), 0);
        assert_eq!(index.overlap(1, &[], now), 0);
    }

    #[test]
    fn removed_blocks_break_the_chain() {
        let now = Instant::now();
        let mut index = ApproxIndexer::new(TTL, 100);
        index.record(1, &[10, 11, 12], now);
        index.remove_blocks(1, &[11, 99]);
        assert_eq!(index.overlap(1, &[10, 11, 12], now), 1);
        assert_eq!(index.block_count(1), 2);
        index.remove_blocks(7, &[10]); // unknown worker: nothing happens
        assert_eq!(index.overlap(1, &[10], now), 1);
    }

    #[test]
    fn the_cap_evicts_the_least_recently_used() {
        let now = Instant::now();
        let mut index = ApproxIndexer::new(TTL, 3);
        index.record(1, &[1, 2, 3], now);
        // Refresh 1, so 2 is now the oldest.
        index.record(1, &[1], now);
        index.record(1, &[4], now);
        assert_eq!(index.block_count(1), 3);
        assert_eq!(index.overlap(1, &[1], now), 1);
        assert_eq!(index.overlap(1, &[2], now), 0);
        assert_eq!(index.overlap(1, &[3], now), 1);
        assert_eq!(index.overlap(1, &[4], now), 1);
    }

    #[test]
    fn entries_expire_after_the_ttl() {
        let start = Instant::now();
        let mut index = ApproxIndexer::new(Duration::from_secs(10), 100);
        index.record(1, &[1, 2], start);
        index.record(1, &[3], start + Duration::from_secs(5));
        let later = start + Duration::from_secs(11);
        assert_eq!(index.overlap(1, &[1, 2], later), 0);
        assert_eq!(index.overlap(1, &[3], later), 1);
        // The next record drops the expired entries.
        index.record(1, &[4], later);
        assert_eq!(index.block_count(1), 2);
        // Refreshing an entry keeps it alive.
        index.record(1, &[3], later);
        assert_eq!(index.overlap(1, &[3], later + Duration::from_secs(9)), 1);
    }

    #[test]
    fn workers_are_removed() {
        let now = Instant::now();
        let mut index = ApproxIndexer::new(TTL, 100);
        index.record(1, &[1], now);
        index.record(2, &[1], now);
        index.record(3, &[1], now);
        index.remove_worker(2);
        assert_eq!(index.overlap(2, &[1], now), 0);
        assert_eq!(index.workers(), vec![1, 3]);
        index.retain_workers(&[3, 4]);
        assert_eq!(index.workers(), vec![3]);
        assert_eq!(index.overlap(3, &[1], now), 1);
    }
}

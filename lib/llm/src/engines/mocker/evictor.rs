//! Least-recently-used order of the cached blocks no sequence is using: the first to be
//! evicted is the one released longest ago.
//!
//! A queue of `(tick, hash)` in release order and a map hash → its latest tick. Taking a
//! hash out only drops it from the map; the queue entry it leaves behind is stale (its
//! tick no longer matches) and is skipped when it reaches the front, or dropped when
//! stale entries outnumber live ones. Every operation is amortised O(1), where a
//! tick-ordered tree costs a log-time insert and removal per released block.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

/// LRU set of block hashes.
#[derive(Debug, Default)]
pub(crate) struct LruEvictor {
    /// Block hash → the tick it was last released at.
    ticks: FxHashMap<u64, u64>,
    /// `(tick, hash)`, oldest first; entries whose tick is not the hash's current one are stale.
    order: VecDeque<(u64, u64)>,
    next_tick: u64,
}

impl LruEvictor {
    /// Add `hash` as the most recently used (moving it if present).
    pub(crate) fn insert(&mut self, hash: u64) {
        let tick = self.next_tick;
        self.next_tick += 1;
        self.ticks.insert(hash, tick);
        self.order.push_back((tick, hash));
        if self.order.len() > 2 * self.ticks.len() + 64 {
            let ticks = &self.ticks;
            self.order.retain(|(tick, hash)| ticks.get(hash) == Some(tick));
        }
    }

    /// Take `hash` out (it is in use again); false if it was not here.
    pub(crate) fn remove(&mut self, hash: u64) -> bool {
        self.ticks.remove(&hash).is_some()
    }

    /// Remove and return the least recently used hash.
    pub(crate) fn evict(&mut self) -> Option<u64> {
        while let Some((tick, hash)) = self.order.pop_front() {
            if self.ticks.get(&hash) == Some(&tick) {
                self.ticks.remove(&hash);
                return Some(hash);
            }
        }
        None
    }

    /// Whether `hash` is here.
    pub(crate) fn contains(&self, hash: u64) -> bool {
        self.ticks.contains_key(&hash)
    }

    /// How many hashes are here.
    pub(crate) fn len(&self) -> usize {
        self.ticks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_inserted_first() {
        let mut lru = LruEvictor::default();
        for h in [10, 20, 30] {
            lru.insert(h);
        }
        lru.insert(10); // used again: now the newest
        assert!(lru.remove(20));
        assert!(!lru.remove(20));
        assert_eq!(lru.len(), 2);
        assert!(lru.contains(30));
        assert_eq!(lru.evict(), Some(30));
        assert_eq!(lru.evict(), Some(10));
        assert_eq!(lru.evict(), None);
    }

    #[test]
    fn stale_entries_are_dropped_and_the_order_kept() {
        // Blocks taken and released again and again never grow the queue without bound.
        let mut lru = LruEvictor::default();
        for round in 0..1000u64 {
            for h in 0..10 {
                lru.insert(h);
                if round % 2 == 0 {
                    assert!(lru.remove(h));
                }
            }
        }
        assert!(lru.order.len() <= 2 * lru.len() + 64 + 1, "{} entries for {}", lru.order.len(), lru.len());
        assert_eq!((0..10).map(|_| lru.evict().unwrap()).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
        assert_eq!(lru.evict(), None);
    }
}

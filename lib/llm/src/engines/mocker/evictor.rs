//! Least-recently-used order of the cached blocks no sequence is using: the first to be
//! evicted is the one released longest ago.

use std::collections::{BTreeMap, HashMap};

/// LRU set of block hashes.
#[derive(Debug, Default)]
pub(crate) struct LruEvictor {
    /// Block hash → the tick it was last released at.
    ticks: HashMap<u64, u64>,
    /// Tick → block hash, oldest first.
    order: BTreeMap<u64, u64>,
    next_tick: u64,
}

impl LruEvictor {
    /// Add `hash` as the most recently used (moving it if present).
    pub(crate) fn insert(&mut self, hash: u64) {
        self.remove(hash);
        let tick = self.next_tick;
        self.next_tick += 1;
        self.ticks.insert(hash, tick);
        self.order.insert(tick, hash);
    }

    /// Take `hash` out (it is in use again); false if it was not here.
    pub(crate) fn remove(&mut self, hash: u64) -> bool {
        match self.ticks.remove(&hash) {
            Some(tick) => {
                self.order.remove(&tick);
                true
            }
            None => false,
        }
    }

    /// Remove and return the least recently used hash.
    pub(crate) fn evict(&mut self) -> Option<u64> {
        let (_, hash) = self.order.pop_first()?;
        self.ticks.remove(&hash);
        Some(hash)
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
}

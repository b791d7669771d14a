//! The simulated paged KV cache: a fixed number of blocks, each either free, a
//! *private* block of one sequence (partial, or not yet computed), an *active* full
//! block shared by reference count, or an *inactive* full block no one uses but kept
//! cached for later prompts with the same prefix (evicted least recently used first).
//! Changes the KV router must know are queued as [`KvCacheEventData`].

use rustc_hash::FxHashMap;

use crate::kv_router::protocols::{BlockHash, KvCacheEventData, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData};
use super::evictor::LruEvictor;

/// No free block and nothing left to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("KV cache has no free block")]
pub(crate) struct OutOfBlocks;

/// Block accounting of one worker's cache.
#[derive(Debug)]
pub(crate) struct KvManager {
    capacity: usize,
    /// Full blocks in use: block hash → number of sequences holding it.
    active: FxHashMap<u64, usize>,
    /// Full blocks cached but unused.
    inactive: LruEvictor,
    /// Blocks private to one sequence.
    private: usize,
    pending: Vec<KvCacheEventData>,
}

impl KvManager {
    /// An empty cache of `capacity` blocks.
    pub(crate) fn new(capacity: usize) -> Self {
        KvManager { capacity, active: FxHashMap::default(), inactive: LruEvictor::default(), private: 0, pending: Vec::new() }
    }

    /// Blocks in all.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks held by sequences (shared full blocks count once).
    pub(crate) fn active_blocks(&self) -> usize {
        self.active.len() + self.private
    }

    /// Cached blocks nobody holds.
    #[cfg(test)]
    pub(crate) fn inactive_blocks(&self) -> usize {
        self.inactive.len()
    }

    /// Blocks a new sequence may take: free ones plus evictable cached ones.
    pub(crate) fn available_blocks(&self) -> usize {
        self.capacity - self.active_blocks()
    }

    /// Whether a full block with this hash is in the cache (in use or not).
    pub(crate) fn is_cached(&self, block_hash: u64) -> bool {
        self.active.contains_key(&block_hash) || self.inactive.contains(block_hash)
    }

    /// Whether a full block with this hash is held by some sequence.
    pub(crate) fn is_active(&self, block_hash: u64) -> bool {
        self.active.contains_key(&block_hash)
    }

    /// Sequences holding this full block (0 when not active).
    #[cfg(test)]
    pub(crate) fn ref_count(&self, block_hash: u64) -> usize {
        self.active.get(&block_hash).copied().unwrap_or(0)
    }

    /// Hold the full block `hash` (whose predecessor is `parent`): share it if active,
    /// revive it if cached, else take a free block (evicting if needed) and queue a
    /// `stored` event.
    pub(crate) fn acquire_full(&mut self, hash: BlockHash, parent: Option<u64>) -> Result<(), OutOfBlocks> {
        if let Some(refs) = self.active.get_mut(&hash.block_hash) {
            *refs += 1;
            return Ok(());
        }
        if self.inactive.remove(hash.block_hash) {
            self.active.insert(hash.block_hash, 1);
            return Ok(());
        }
        self.make_room()?;
        self.active.insert(hash.block_hash, 1);
        self.queue_stored(parent, hash);
        Ok(())
    }

    /// Take a private block (evicting a cached one if needed).
    pub(crate) fn acquire_private(&mut self) -> Result<(), OutOfBlocks> {
        self.make_room()?;
        self.private += 1;
        Ok(())
    }

    /// Let go of a full block; the last holder leaves it cached.
    pub(crate) fn release_full(&mut self, block_hash: u64) {
        match self.active.get_mut(&block_hash) {
            Some(refs) if *refs > 1 => *refs -= 1,
            Some(_) => {
                self.active.remove(&block_hash);
                self.inactive.insert(block_hash);
            }
            None => tracing::warn!(block_hash, "released a block that is not active"),
        }
    }

    /// Free a private block.
    pub(crate) fn release_private(&mut self) {
        debug_assert!(self.private > 0, "released a private block that was not taken");
        self.private = self.private.saturating_sub(1);
    }

    /// Turn a computed private block into the shareable full block `hash` (never needs
    /// a new block: the private one is freed first).
    pub(crate) fn promote(&mut self, hash: BlockHash, parent: Option<u64>) {
        self.release_private();
        if self.acquire_full(hash, parent).is_err() {
            // Unreachable: the block just freed is free.
            tracing::error!("promoting a block found no free block");
            self.private += 1;
        }
    }

    /// The events queued since the last call, in order.
    pub(crate) fn take_events(&mut self) -> Vec<KvCacheEventData> {
        std::mem::take(&mut self.pending)
    }

    fn make_room(&mut self) -> Result<(), OutOfBlocks> {
        if self.active_blocks() + self.inactive.len() < self.capacity {
            return Ok(());
        }
        let evicted = self.inactive.evict().ok_or(OutOfBlocks)?;
        match self.pending.last_mut() {
            Some(KvCacheEventData::Removed(data)) => data.block_hashes.push(evicted),
            _ => self.pending.push(KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: vec![evicted] })),
        }
        Ok(())
    }

    /// Queue a `stored` event, extending the previous one when this block continues it.
    fn queue_stored(&mut self, parent: Option<u64>, hash: BlockHash) {
        let block = KvCacheStoredBlockData { block_hash: hash.block_hash, tokens_hash: hash.tokens_hash };
        if let (Some(KvCacheEventData::Stored(data)), Some(parent)) = (self.pending.last_mut(), parent) {
            if data.blocks.last().map(|b| b.block_hash) == Some(parent) {
                data.blocks.push(block);
                return;
            }
        }
        self.pending.push(KvCacheEventData::Stored(KvCacheStoreData { parent_hash: parent, blocks: vec![block] }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_router::protocols::hash_full_blocks;

    fn stored_hashes(events: &[KvCacheEventData]) -> Vec<u64> {
        events
            .iter()
            .flat_map(|e| match e {
                KvCacheEventData::Stored(d) => d.blocks.iter().map(|b| b.block_hash).collect(),
                _ => vec![],
            })
            .collect()
    }

    /// Hold every full block of `tokens` as one sequence would; returns the hashes.
    fn hold(kv: &mut KvManager, tokens: &[u32]) -> Vec<BlockHash> {
        let hashes = hash_full_blocks(tokens, 4);
        let mut parent = None;
        for h in &hashes {
            kv.acquire_full(*h, parent).unwrap();
            parent = Some(h.block_hash);
        }
        hashes
    }

    #[test]
    fn prefix_is_shared_and_only_new_blocks_are_stored() {
        let mut kv = KvManager::new(100);
        let a: Vec<u32> = (0..16).collect(); // 4 blocks
        let ha = hold(&mut kv, &a);
        let events = kv.take_events();
        assert_eq!(events.len(), 1, "one chained stored event: {events:?}");
        let KvCacheEventData::Stored(data) = &events[0] else { panic!("{events:?}") };
        assert_eq!(data.parent_hash, None);
        assert_eq!(data.blocks.len(), 4);
        assert_eq!(kv.active_blocks(), 4);

        let mut b = a.clone();
        b.extend(100..108); // same 4-block prefix + 2 new blocks
        let hb = hold(&mut kv, &b);
        assert_eq!(kv.active_blocks(), 6, "only the 2 new blocks were allocated");
        let events = kv.take_events();
        let KvCacheEventData::Stored(data) = &events[0] else { panic!("{events:?}") };
        assert_eq!(data.parent_hash, Some(ha[3].block_hash));
        assert_eq!(stored_hashes(&events), vec![hb[4].block_hash, hb[5].block_hash]);
        assert_eq!(kv.ref_count(ha[0].block_hash), 2);
        assert_eq!(kv.ref_count(hb[5].block_hash), 1);
    }

    #[test]
    fn released_blocks_stay_cached_then_lru_evicted() {
        let mut kv = KvManager::new(4);
        let first = hold(&mut kv, &(0..8).collect::<Vec<_>>()); // 2 blocks
        let second = hold(&mut kv, &(50..58).collect::<Vec<_>>()); // 2 blocks
        kv.take_events();
        for h in &first {
            kv.release_full(h.block_hash);
        }
        for h in &second {
            kv.release_full(h.block_hash);
        }
        assert_eq!((kv.active_blocks(), kv.inactive_blocks(), kv.available_blocks()), (0, 4, 4));
        assert!(kv.is_cached(first[0].block_hash) && !kv.is_active(first[0].block_hash));
        // Reusing `second[0]` makes it the most recently used.
        kv.acquire_full(second[0], None).unwrap();
        assert!(kv.take_events().is_empty(), "a revived cached block is not stored again");
        kv.release_full(second[0].block_hash);
        // Two private blocks evict the two oldest: the first sequence's blocks.
        kv.acquire_private().unwrap();
        kv.acquire_private().unwrap();
        let events = kv.take_events();
        assert_eq!(
            events,
            vec![KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: vec![first[0].block_hash, first[1].block_hash]
            })]
        );
        assert!(!kv.is_cached(first[0].block_hash));
        assert!(kv.is_cached(second[0].block_hash));
    }

    #[test]
    fn full_cache_of_active_blocks_refuses() {
        let mut kv = KvManager::new(2);
        kv.acquire_private().unwrap();
        let h = hash_full_blocks(&[1, 2, 3, 4], 4)[0];
        kv.acquire_full(h, None).unwrap();
        assert_eq!(kv.acquire_private(), Err(OutOfBlocks));
        // Sharing an active block needs no new block.
        kv.acquire_full(h, None).unwrap();
        assert_eq!(kv.ref_count(h.block_hash), 2);
        kv.release_full(h.block_hash);
        assert!(kv.is_active(h.block_hash));
        kv.release_full(h.block_hash);
        assert!(!kv.is_active(h.block_hash) && kv.is_cached(h.block_hash));
        kv.release_private();
        assert_eq!(kv.active_blocks(), 0);
    }

    #[test]
    fn promote_turns_a_private_block_into_a_stored_one() {
        let mut kv = KvManager::new(1);
        kv.acquire_private().unwrap();
        let h = hash_full_blocks(&[1, 2, 3, 4], 4)[0];
        kv.promote(h, None);
        assert_eq!(kv.active_blocks(), 1);
        assert_eq!(stored_hashes(&kv.take_events()), vec![h.block_hash]);
    }
}

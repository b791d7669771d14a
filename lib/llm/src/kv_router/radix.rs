//! The fleet's KV cache index: one radix tree whose edges are blocks' `tokens_hash`es, so
//! a path from the root is a token prefix, and whose nodes list the workers holding that
//! prefix's last block. Workers' KV events ([`KvCacheEvent`]) grow and prune it; in the
//! approximate mode the router's own decisions insert entries that expire after a TTL.
//!
//! Layout, for speed: nodes live in one arena (`Vec`, freed slots reused); a node's
//! children are found through a single map keyed by `(parent, tokens_hash)` (no per-node
//! map); a node's workers are a small inline vector. Each worker has a map from its own
//! block ids (`block_hash`, what `parent_hash` and `removed` name) to nodes.
//!
//! Events that cannot be applied exactly (a `parent_hash` the worker never stored, a
//! removal of a block it does not hold, a gap in `event_id`s) are counted in
//! [`IndexStats`] and otherwise ignored: a lost event must never stop the router.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use rustc_hash::FxHashMap;
use smallvec::SmallVec;

use super::protocols::{
    chain_block_hashes, KvCacheEvent, KvCacheEventData, KvCacheStoreData, KvCacheStoredBlockData, RouterEvent,
};

/// A worker's id: the runtime's instance id of its endpoint.
pub type WorkerId = u64;

/// The parent of the first block of every sequence.
const ROOT: u32 = u32::MAX;

/// How many leading blocks of a request each worker holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverlapScores {
    /// Worker → number of leading request blocks it holds (workers holding none are absent).
    pub scores: HashMap<WorkerId, u32>,
}

/// Counters of what the index did with the events it was given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Events applied (including those partly or wholly ignored below).
    pub events: u64,
    /// `stored` events dropped because their `parent_hash` was not a block of that worker.
    pub unknown_parents: u64,
    /// Block ids in `removed` events that the worker did not hold (a removal that
    /// overtook its store, or a repeat).
    pub unknown_removals: u64,
    /// Times a worker's `event_id` was not the previous one plus one (events lost or
    /// reordered on the way).
    pub event_id_gaps: u64,
    /// Predicted entries dropped because their TTL passed or a worker's cap was reached.
    pub expired: u64,
}

#[derive(Debug)]
struct Node {
    parent: u32,
    depth: u32,
    /// Live children (nodes whose `parent` is this one).
    children: u32,
    tokens_hash: u64,
    /// The workers holding this block, each with how many of its block ids name it.
    workers: SmallVec<[(WorkerId, u32); 4]>,
    /// Bit `s` set: the worker in slot `s` (< 64) holds this block. Lets
    /// `find_matches` intersect worker sets with one AND while the fleet has ≤ 64 workers.
    mask: u64,
}

/// One block of a worker in a [`RadixTree::snapshot`]; serialized as an array
/// `[worker, block_hash, parent_hash, tokens_hash, ttl_ms]` to keep snapshots small.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "SnapshotTuple", from = "SnapshotTuple")]
pub struct SnapshotBlock {
    /// The worker holding it.
    pub worker: WorkerId,
    /// The worker's id for the block.
    pub block_hash: u64,
    /// The worker's id for its parent (`None`: first block of a sequence).
    pub parent_hash: Option<u64>,
    /// The content hash ([`super::compute_block_hash_for_seq`]).
    pub tokens_hash: u64,
    /// `None`: confirmed by an event; `Some`: predicted, trusted this many more ms.
    pub ttl_ms: Option<u64>,
}

type SnapshotTuple = (WorkerId, u64, Option<u64>, u64, Option<u64>);

impl From<SnapshotBlock> for SnapshotTuple {
    fn from(b: SnapshotBlock) -> Self {
        (b.worker, b.block_hash, b.parent_hash, b.tokens_hash, b.ttl_ms)
    }
}

impl From<SnapshotTuple> for SnapshotBlock {
    fn from((worker, block_hash, parent_hash, tokens_hash, ttl_ms): SnapshotTuple) -> Self {
        SnapshotBlock { worker, block_hash, parent_hash, tokens_hash, ttl_ms }
    }
}

/// One block id of a worker.
#[derive(Debug, Clone, Copy)]
struct Held {
    node: u32,
    /// `None`: confirmed by an event; `Some`: predicted by the router, trusted until then.
    expires: Option<Instant>,
}

#[derive(Debug, Default)]
struct WorkerState {
    /// Dense index of the worker (see [`RadixTree::slots`]).
    slot: u32,
    blocks: FxHashMap<u64, Held>,
    /// Predicted entries in the order they were last touched: `(expiry, block id)`.
    /// An entry is stale (skipped) when the block's `expires` no longer equals it.
    predicted_order: VecDeque<(Instant, u64)>,
    /// Blocks whose `expires` is `Some`.
    predicted: usize,
    last_event_id: Option<u64>,
}

/// The radix tree of every worker's cached blocks. Not synchronized: the router keeps it
/// behind a lock.
#[derive(Debug)]
pub struct RadixTree {
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// `(parent node or ROOT, tokens_hash)` → child node.
    edges: FxHashMap<(u32, u64), u32>,
    workers: FxHashMap<WorkerId, WorkerState>,
    /// Slot → worker id (stale for free slots); workers get the lowest free slot.
    slots: Vec<WorkerId>,
    free_slots: Vec<u32>,
    /// Live workers whose slot is 64 or more (then `find_matches` compares lists).
    big_slots: usize,
    ttl: Duration,
    max_predicted_per_worker: usize,
    stats: IndexStats,
}

impl Default for RadixTree {
    fn default() -> Self {
        RadixTree::new()
    }
}

impl RadixTree {
    /// An empty index; predicted entries (see [`Self::record_prediction`]) live 120 s,
    /// at most 65,536 per worker.
    pub fn new() -> Self {
        RadixTree::with_prediction_limits(Duration::from_secs(120), 65_536)
    }

    /// An empty index whose predicted entries expire `ttl` after their last use, at most
    /// `max_predicted_per_worker` (at least 1) per worker, least recently used dropped first.
    pub fn with_prediction_limits(ttl: Duration, max_predicted_per_worker: usize) -> Self {
        RadixTree {
            nodes: Vec::new(),
            free: Vec::new(),
            edges: FxHashMap::default(),
            workers: FxHashMap::default(),
            slots: Vec::new(),
            free_slots: Vec::new(),
            big_slots: 0,
            ttl,
            max_predicted_per_worker: max_predicted_per_worker.max(1),
            stats: IndexStats::default(),
        }
    }

    /// Apply one KV event of `worker`. Never fails: what cannot be applied is counted.
    pub fn apply_event(&mut self, worker: WorkerId, event: &KvCacheEvent) {
        self.stats.events += 1;
        let state = self.worker_state(worker);
        let gap = state.last_event_id.is_some_and(|last| last.wrapping_add(1) != event.event_id);
        state.last_event_id = Some(event.event_id);
        if gap {
            self.stats.event_id_gaps += 1;
        }
        match &event.data {
            KvCacheEventData::Stored(stored) => self.store(worker, stored, None),
            KvCacheEventData::Removed(removed) => self.remove_blocks(worker, &removed.block_hashes),
            KvCacheEventData::Cleared => self.clear_worker(worker),
        }
    }

    /// [`Self::apply_event`] for an event as published (with its worker id).
    pub fn apply_router_event(&mut self, event: &RouterEvent) {
        self.apply_event(event.worker_id, &event.event);
    }

    /// Record that the router sent `worker` a request whose blocks have these tokens
    /// hashes: it is predicted to hold them (under the chained block ids the mocker
    /// uses, see [`chain_block_hashes`]) until the TTL passes without another use.
    /// Entries an event confirmed stay confirmed.
    pub fn record_prediction(&mut self, worker: WorkerId, tokens_hashes: &[u64], now: Instant) {
        let blocks: Vec<KvCacheStoredBlockData> = chain_block_hashes(tokens_hashes)
            .into_iter()
            .map(|h| KvCacheStoredBlockData { block_hash: h.block_hash, tokens_hash: h.tokens_hash })
            .collect();
        self.worker_state(worker);
        self.store(worker, &KvCacheStoreData { parent_hash: None, blocks }, Some(now + self.ttl));
        self.expire_worker(worker, now);
    }

    /// Drop predicted entries whose TTL passed before `now`.
    pub fn expire(&mut self, now: Instant) {
        let workers: Vec<WorkerId> = self.workers.keys().copied().collect();
        for worker in workers {
            self.expire_worker(worker, now);
        }
    }

    /// How many leading blocks of a request (its blocks' tokens hashes, in order, as
    /// [`super::compute_block_hash_for_seq`] gives) each worker holds. Walks the tree
    /// once, carrying the set of workers that held every block so far.
    pub fn find_matches(&self, tokens_hashes: &[u64]) -> OverlapScores {
        if self.big_slots == 0 {
            return self.find_matches_by_mask(tokens_hashes);
        }
        let mut scores = HashMap::new();
        let mut active: SmallVec<[WorkerId; 16]> = SmallVec::new();
        let mut parent = ROOT;
        let mut matched = 0u32;
        for &hash in tokens_hashes {
            let Some(&node) = self.edges.get(&(parent, hash)) else { break };
            let holders = &self.nodes[node as usize].workers;
            if matched == 0 {
                active.extend(holders.iter().map(|(w, _)| *w));
            } else {
                active.retain(|w| {
                    let keep = holders.iter().any(|(h, _)| h == w);
                    if !keep {
                        scores.insert(*w, matched);
                    }
                    keep
                });
            }
            if active.is_empty() {
                break;
            }
            matched += 1;
            parent = node;
        }
        for w in active {
            scores.insert(w, matched);
        }
        OverlapScores { scores }
    }

    /// [`Self::find_matches`] for fleets whose slots all fit a `u64` mask.
    fn find_matches_by_mask(&self, tokens_hashes: &[u64]) -> OverlapScores {
        let mut scores = HashMap::new();
        let mut active = 0u64;
        let mut parent = ROOT;
        let mut matched = 0u32;
        for &hash in tokens_hashes {
            let Some(&node) = self.edges.get(&(parent, hash)) else { break };
            let mask = self.nodes[node as usize].mask;
            if matched == 0 {
                active = mask;
            } else {
                let mut dropped = active & !mask;
                while dropped != 0 {
                    scores.insert(self.slots[dropped.trailing_zeros() as usize], matched);
                    dropped &= dropped - 1;
                }
                active &= mask;
            }
            if active == 0 {
                break;
            }
            matched += 1;
            parent = node;
        }
        while active != 0 {
            scores.insert(self.slots[active.trailing_zeros() as usize], matched);
            active &= active - 1;
        }
        OverlapScores { scores }
    }

    /// Forget `worker` (it left discovery).
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.clear_worker(worker);
        if let Some(state) = self.workers.remove(&worker) {
            self.free_slots.push(state.slot);
            if state.slot >= 64 {
                self.big_slots -= 1;
            }
        }
    }

    fn worker_state(&mut self, worker: WorkerId) -> &mut WorkerState {
        let RadixTree { workers, slots, free_slots, big_slots, .. } = self;
        workers.entry(worker).or_insert_with(|| {
            // Lowest free slot first, so that masks stay usable as long as possible.
            let slot = match free_slots.iter().enumerate().min_by_key(|(_, s)| **s) {
                Some((i, _)) => free_slots.swap_remove(i),
                None => {
                    slots.push(worker);
                    (slots.len() - 1) as u32
                }
            };
            slots[slot as usize] = worker;
            if slot >= 64 {
                *big_slots += 1;
            }
            WorkerState { slot, ..Default::default() }
        })
    }

    /// Forget every worker not in `live`.
    pub fn retain_workers(&mut self, live: &[WorkerId]) {
        let gone: Vec<WorkerId> = self.workers.keys().filter(|w| !live.contains(w)).copied().collect();
        for worker in gone {
            self.remove_worker(worker);
        }
    }

    /// The workers with an entry in the index, ascending.
    pub fn workers(&self) -> Vec<WorkerId> {
        let mut ids: Vec<WorkerId> = self.workers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// Block ids `worker` holds (confirmed or predicted).
    pub fn block_count(&self, worker: WorkerId) -> usize {
        self.workers.get(&worker).map_or(0, |s| s.blocks.len())
    }

    /// Nodes in the tree (distinct prefixes held by any worker, or on the way to one).
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    /// What the index did with the events it was given.
    pub fn stats(&self) -> IndexStats {
        self.stats
    }

    /// The whole index as `stored` events, one block each, every block after its parent:
    /// applied in order to an empty tree they give the same [`Self::find_matches`] answers.
    /// A block whose chain to the root the worker does not hold entirely (its parent was
    /// removed first) is left out, as it cannot match. Predicted entries come out as
    /// plain (confirmed) blocks (see [`Self::snapshot`] to keep them predicted).
    pub fn dump(&self) -> Vec<RouterEvent> {
        let mut next_id: FxHashMap<WorkerId, u64> = FxHashMap::default();
        self.snapshot(Instant::now())
            .into_iter()
            .map(|b| {
                let id = next_id.entry(b.worker).or_default();
                let event_id = *id;
                *id += 1;
                let data = KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: b.parent_hash,
                    blocks: vec![KvCacheStoredBlockData { block_hash: b.block_hash, tokens_hash: b.tokens_hash }],
                });
                RouterEvent { worker_id: b.worker, event: KvCacheEvent { event_id, data } }
            })
            .collect()
    }

    /// Every block of every worker, each after its parent, predicted ones with the time
    /// they have left after `now`: what a new router replica restores
    /// ([`Self::restore`]) to start from this one's view. Blocks whose chain to the root
    /// the worker does not hold entirely are left out, as they cannot match.
    pub fn snapshot(&self, now: Instant) -> Vec<SnapshotBlock> {
        let mut out = Vec::new();
        for worker in self.workers() {
            let state = &self.workers[&worker];
            let mut held: Vec<(u32, u64, Option<Instant>)> =
                state.blocks.iter().map(|(&id, h)| (h.node, id, h.expires)).collect();
            held.sort_unstable_by_key(|&(node, id, _)| (self.nodes[node as usize].depth, node, id));
            // Node → the block id under which it was emitted for this worker.
            let mut emitted: FxHashMap<u32, u64> = FxHashMap::default();
            for (node, id, expires) in held {
                let n = &self.nodes[node as usize];
                let parent_hash = if n.parent == ROOT {
                    None
                } else {
                    match emitted.get(&n.parent) {
                        Some(&p) => Some(p),
                        None => continue,
                    }
                };
                emitted.entry(node).or_insert(id);
                let ttl_ms = expires.map(|at| at.saturating_duration_since(now).as_millis() as u64);
                out.push(SnapshotBlock { worker, block_hash: id, parent_hash, tokens_hash: n.tokens_hash, ttl_ms });
            }
        }
        out
    }

    /// Add the blocks of a [`Self::snapshot`] (taken by another replica), predicted ones
    /// expiring after the time they had left. Blocks already held keep their state when
    /// confirmed; a block whose parent is unknown is counted and skipped, as for events.
    pub fn restore(&mut self, blocks: &[SnapshotBlock], now: Instant) {
        for b in blocks {
            self.worker_state(b.worker);
            let expires = b.ttl_ms.map(|ms| now + Duration::from_millis(ms));
            let stored = KvCacheStoreData {
                parent_hash: b.parent_hash,
                blocks: vec![KvCacheStoredBlockData { block_hash: b.block_hash, tokens_hash: b.tokens_hash }],
            };
            self.store(b.worker, &stored, expires);
        }
        self.expire(now);
    }

    fn store(&mut self, worker: WorkerId, stored: &KvCacheStoreData, expires: Option<Instant>) {
        let RadixTree { nodes, free, edges, workers, stats, .. } = self;
        let Some(state) = workers.get_mut(&worker) else { return };
        let slot = state.slot;
        let mut parent = match stored.parent_hash {
            None => ROOT,
            Some(id) => match state.blocks.get(&id) {
                Some(held) => held.node,
                None => {
                    stats.unknown_parents += 1;
                    return;
                }
            },
        };
        for block in &stored.blocks {
            let node = match edges.entry((parent, block.tokens_hash)) {
                Entry::Occupied(e) => *e.get(),
                Entry::Vacant(e) => {
                    let depth = if parent == ROOT { 0 } else { nodes[parent as usize].depth + 1 };
                    let fresh = Node {
                        parent,
                        depth,
                        children: 0,
                        tokens_hash: block.tokens_hash,
                        workers: SmallVec::new(),
                        mask: 0,
                    };
                    let index = match free.pop() {
                        Some(slot) => {
                            nodes[slot as usize] = fresh;
                            slot
                        }
                        None => {
                            nodes.push(fresh);
                            (nodes.len() - 1) as u32
                        }
                    };
                    if parent != ROOT {
                        nodes[parent as usize].children += 1;
                    }
                    *e.insert(index)
                }
            };
            match state.blocks.entry(block.block_hash) {
                Entry::Occupied(mut e) => {
                    let held = e.get_mut();
                    if held.node != node {
                        let old = held.node;
                        if held.expires.is_some() {
                            state.predicted -= 1;
                        }
                        *held = Held { node, expires };
                        if expires.is_some() {
                            state.predicted += 1;
                        }
                        add_holder(nodes, node, worker, slot);
                        release(nodes, free, edges, old, worker, slot);
                    } else if held.expires.is_some() {
                        // Confirm, or refresh the prediction; a confirmed block stays confirmed.
                        if expires.is_none() {
                            state.predicted -= 1;
                        }
                        held.expires = expires;
                    }
                }
                Entry::Vacant(e) => {
                    e.insert(Held { node, expires });
                    if expires.is_some() {
                        state.predicted += 1;
                    }
                    add_holder(nodes, node, worker, slot);
                }
            }
            if let Some(at) = expires {
                state.predicted_order.push_back((at, block.block_hash));
            }
            parent = node;
        }
    }

    fn remove_blocks(&mut self, worker: WorkerId, ids: &[u64]) {
        let RadixTree { nodes, free, edges, workers, stats, .. } = self;
        let Some(state) = workers.get_mut(&worker) else {
            stats.unknown_removals += ids.len() as u64;
            return;
        };
        let slot = state.slot;
        for id in ids {
            match state.blocks.remove(id) {
                Some(held) => {
                    if held.expires.is_some() {
                        state.predicted -= 1;
                    }
                    release(nodes, free, edges, held.node, worker, slot);
                }
                None => stats.unknown_removals += 1,
            }
        }
    }

    fn clear_worker(&mut self, worker: WorkerId) {
        let RadixTree { nodes, free, edges, workers, .. } = self;
        let Some(state) = workers.get_mut(&worker) else { return };
        let slot = state.slot;
        for (_, held) in state.blocks.drain() {
            release(nodes, free, edges, held.node, worker, slot);
        }
        state.predicted = 0;
        state.predicted_order.clear();
    }

    fn expire_worker(&mut self, worker: WorkerId, now: Instant) {
        let RadixTree { nodes, free, edges, workers, stats, max_predicted_per_worker, .. } = self;
        let Some(state) = workers.get_mut(&worker) else { return };
        let slot = state.slot;
        while let Some(&(at, id)) = state.predicted_order.front() {
            let over_cap = state.predicted > *max_predicted_per_worker;
            if at > now && !over_cap {
                break;
            }
            state.predicted_order.pop_front();
            let current = state.blocks.get(&id).is_some_and(|h| h.expires == Some(at));
            if current {
                if let Some(held) = state.blocks.remove(&id) {
                    state.predicted -= 1;
                    stats.expired += 1;
                    release(nodes, free, edges, held.node, worker, slot);
                }
            }
        }
    }
}

fn slot_bit(slot: u32) -> u64 {
    if slot < 64 {
        1 << slot
    } else {
        0
    }
}

fn add_holder(nodes: &mut [Node], node: u32, worker: WorkerId, slot: u32) {
    let n = &mut nodes[node as usize];
    match n.workers.iter_mut().find(|(w, _)| *w == worker) {
        Some((_, refs)) => *refs += 1,
        None => {
            n.workers.push((worker, 1));
            n.mask |= slot_bit(slot);
        }
    }
}

/// Drop one of `worker`'s references to `node`, then free the node, and its ancestors in
/// turn, while they have neither workers nor children.
fn release(
    nodes: &mut [Node],
    free: &mut Vec<u32>,
    edges: &mut FxHashMap<(u32, u64), u32>,
    node: u32,
    worker: WorkerId,
    slot: u32,
) {
    let n = &mut nodes[node as usize];
    if let Some(i) = n.workers.iter().position(|(w, _)| *w == worker) {
        n.workers[i].1 -= 1;
        if n.workers[i].1 == 0 {
            n.workers.swap_remove(i);
            n.mask &= !slot_bit(slot);
        }
    }
    let mut node = node;
    loop {
        let n = &nodes[node as usize];
        if !n.workers.is_empty() || n.children > 0 {
            return;
        }
        let parent = n.parent;
        edges.remove(&(parent, n.tokens_hash));
        free.push(node);
        if parent == ROOT {
            return;
        }
        nodes[parent as usize].children -= 1;
        node = parent;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_router::protocols::{compute_block_hash_for_seq, KvCacheRemoveData};

    fn stored(event_id: u64, parent_hash: Option<u64>, blocks: &[(u64, u64)]) -> KvCacheEvent {
        let blocks = blocks.iter().map(|&(block_hash, tokens_hash)| KvCacheStoredBlockData { block_hash, tokens_hash });
        KvCacheEvent {
            event_id,
            data: KvCacheEventData::Stored(KvCacheStoreData { parent_hash, blocks: blocks.collect() }),
        }
    }

    fn removed(event_id: u64, ids: &[u64]) -> KvCacheEvent {
        KvCacheEvent { event_id, data: KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: ids.to_vec() }) }
    }

    fn scores(tree: &RadixTree, hashes: &[u64]) -> Vec<(WorkerId, u32)> {
        let mut s: Vec<_> = tree.find_matches(hashes).scores.into_iter().collect();
        s.sort_unstable();
        s
    }

    #[test]
    fn workers_share_nodes_and_scores_count_leading_blocks() {
        let mut tree = RadixTree::new();
        // Worker 1 holds A B C, worker 2 holds A B D; engine ids differ per worker.
        tree.apply_event(1, &stored(0, None, &[(11, 0xA), (12, 0xB), (13, 0xC)]));
        tree.apply_event(2, &stored(0, None, &[(21, 0xA), (22, 0xB)]));
        tree.apply_event(2, &stored(1, Some(22), &[(23, 0xD)]));
        assert_eq!(tree.node_count(), 4);
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xC]), vec![(1, 3), (2, 2)]);
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xD, 0xE]), vec![(1, 2), (2, 3)]);
        assert_eq!(scores(&tree, &[0xB]), vec![]);
        assert_eq!(scores(&tree, &[]), vec![]);
        assert_eq!(tree.stats(), IndexStats { events: 3, ..Default::default() });
    }

    #[test]
    fn a_hole_in_the_chain_stops_the_count() {
        let mut tree = RadixTree::new();
        tree.apply_event(1, &stored(0, None, &[(1, 0xA), (2, 0xB), (3, 0xC)]));
        tree.apply_event(2, &stored(0, None, &[(1, 0xA), (2, 0xB), (3, 0xC)]));
        // Worker 1 evicts B before C (out of order): only A counts for it.
        tree.apply_event(1, &removed(1, &[2]));
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xC]), vec![(1, 1), (2, 3)]);
        // B coming back makes C reachable again: worker 1 still holds it.
        tree.apply_event(1, &stored(2, Some(1), &[(2, 0xB)]));
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xC]), vec![(1, 3), (2, 3)]);
    }

    #[test]
    fn unknown_parents_and_removals_are_counted_not_fatal() {
        let mut tree = RadixTree::new();
        tree.apply_event(1, &stored(0, Some(99), &[(1, 0xA)]));
        assert_eq!(tree.stats().unknown_parents, 1);
        assert_eq!(tree.node_count(), 0);
        tree.apply_event(1, &removed(1, &[5, 6]));
        tree.apply_event(7, &removed(0, &[5]));
        assert_eq!(tree.stats().unknown_removals, 3);
        // Event 3 after 1: one gap. The index still works.
        tree.apply_event(1, &stored(3, None, &[(1, 0xA)]));
        assert_eq!(tree.stats().event_id_gaps, 1);
        assert_eq!(scores(&tree, &[0xA]), vec![(1, 1)]);
        assert_eq!(tree.stats().events, 4);
    }

    #[test]
    fn removals_free_nodes_and_remove_worker_forgets_everything() {
        let mut tree = RadixTree::new();
        tree.apply_event(1, &stored(0, None, &[(1, 0xA), (2, 0xB)]));
        tree.apply_event(2, &stored(0, None, &[(5, 0xA), (6, 0xC)]));
        assert_eq!(tree.node_count(), 3);
        tree.apply_event(1, &removed(1, &[2]));
        assert_eq!(tree.node_count(), 2);
        tree.remove_worker(2);
        assert_eq!(tree.node_count(), 1);
        assert_eq!(tree.workers(), vec![1]);
        assert_eq!(scores(&tree, &[0xA, 0xC]), vec![(1, 1)]);
        tree.apply_event(1, &KvCacheEvent { event_id: 2, data: KvCacheEventData::Cleared });
        assert_eq!(tree.node_count(), 0);
        assert_eq!(tree.block_count(1), 0);
        // Freed slots are reused.
        tree.apply_event(3, &stored(0, None, &[(1, 0xA), (2, 0xB), (3, 0xC)]));
        assert_eq!(tree.nodes.len(), 3);
    }

    #[test]
    fn predictions_expire_and_events_confirm_them() {
        let t0 = Instant::now();
        let mut tree = RadixTree::with_prediction_limits(Duration::from_secs(10), 100);
        let tokens: Vec<u32> = (0..64).collect();
        let hashes = compute_block_hash_for_seq(&tokens, 16);
        tree.record_prediction(1, &hashes, t0);
        tree.record_prediction(2, &hashes[..2], t0);
        assert_eq!(scores(&tree, &hashes), vec![(1, 4), (2, 2)]);
        // Worker 2 confirms its first block with an event (the mocker's ids are the chained ones).
        let ids = chain_block_hashes(&hashes);
        tree.apply_event(2, &stored(0, None, &[(ids[0].block_hash, hashes[0])]));
        // Worker 1 uses its prefix again at t0+5: refreshed.
        tree.record_prediction(1, &hashes[..1], t0 + Duration::from_secs(5));
        tree.expire(t0 + Duration::from_secs(11));
        assert_eq!(scores(&tree, &hashes), vec![(1, 1), (2, 1)]);
        tree.expire(t0 + Duration::from_secs(16));
        assert_eq!(scores(&tree, &hashes), vec![(2, 1)]);
        assert_eq!(tree.node_count(), 1);
        assert_eq!(tree.stats().expired, 5);
    }

    #[test]
    fn the_prediction_cap_drops_the_least_recently_used() {
        let t0 = Instant::now();
        let mut tree = RadixTree::with_prediction_limits(Duration::from_secs(100), 3);
        tree.record_prediction(1, &[0xA, 0xB], t0);
        tree.record_prediction(1, &[0xC, 0xD], t0);
        assert_eq!(tree.block_count(1), 3);
        assert_eq!(scores(&tree, &[0xA]), vec![]);
        assert_eq!(scores(&tree, &[0xC, 0xD]), vec![(1, 2)]);
    }

    #[test]
    fn fleets_beyond_64_workers_match_the_same_way() {
        let mut tree = RadixTree::new();
        for w in 0..70u64 {
            // Worker w holds the first w % 4 blocks of A B C.
            let blocks: Vec<(u64, u64)> = [(1, 0xA), (2, 0xB), (3, 0xC)].into_iter().take((w % 4) as usize).collect();
            tree.apply_event(w, &stored(0, None, &blocks));
        }
        let expected: Vec<(WorkerId, u32)> =
            (0..70u64).filter(|w| w % 4 > 0).map(|w| (w, (w % 4) as u32)).collect();
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xC]), expected);
        // With no worker left in a slot beyond 63, the mask path gives the same answers;
        // freed slots are reused, lowest first.
        for w in 60..70u64 {
            tree.remove_worker(w);
        }
        assert_eq!(tree.slots.len(), 70);
        assert_eq!(scores(&tree, &[0xA, 0xB, 0xC]), expected.iter().copied().filter(|(w, _)| *w < 60).collect::<Vec<_>>());
        tree.apply_event(99, &stored(0, None, &[(1, 0xA)]));
        assert_eq!(tree.workers[&99].slot, 60);
    }

    #[test]
    fn dump_replays_into_the_same_index() {
        let mut tree = RadixTree::new();
        tree.apply_event(1, &stored(0, None, &[(1, 0xA), (2, 0xB), (3, 0xC)]));
        tree.apply_event(2, &stored(0, None, &[(7, 0xA), (8, 0xD)]));
        tree.apply_event(2, &stored(1, Some(7), &[(9, 0xB)]));
        tree.apply_event(1, &removed(1, &[2])); // C is unreachable for worker 1
        let mut copy = RadixTree::new();
        for event in tree.dump() {
            copy.apply_router_event(&event);
        }
        assert_eq!(copy.stats().unknown_parents, 0);
        for query in [&[0xA, 0xB, 0xC][..], &[0xA, 0xD], &[0xA, 0xB]] {
            assert_eq!(scores(&copy, query), scores(&tree, query));
        }
        assert_eq!(copy.block_count(1), 1);
        assert_eq!(copy.block_count(2), 3);
    }

    #[test]
    fn a_snapshot_restores_confirmed_and_predicted_blocks() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(10);
        let mut tree = RadixTree::with_prediction_limits(ttl, 100);
        tree.apply_event(1, &stored(0, None, &[(1, 0xA), (2, 0xB)]));
        tree.record_prediction(2, &[0xA, 0xC], t0);
        let later = t0 + Duration::from_secs(4);
        let snapshot = tree.snapshot(later);
        // Small on the wire: an array per block.
        let json = serde_json::to_string(&snapshot).unwrap();
        assert!(json.starts_with("[[1,1,null,10,null],[1,2,1,11,null],[2,"), "{json}");
        assert_eq!(serde_json::from_str::<Vec<SnapshotBlock>>(&json).unwrap(), snapshot);
        let mut copy = RadixTree::with_prediction_limits(ttl, 100);
        let restored_at = t0 + Duration::from_secs(100); // the copy's own clock
        copy.restore(&snapshot, restored_at);
        assert_eq!(scores(&copy, &[0xA, 0xB]), vec![(1, 2), (2, 1)]);
        assert_eq!(scores(&copy, &[0xA, 0xC]), vec![(1, 1), (2, 2)]);
        // Worker 2's prediction had 6 s left; the confirmed blocks never expire.
        copy.expire(restored_at + Duration::from_secs(5));
        assert_eq!(scores(&copy, &[0xA, 0xC]), vec![(1, 1), (2, 2)]);
        copy.expire(restored_at + Duration::from_secs(7));
        assert_eq!(scores(&copy, &[0xA, 0xC]), vec![(1, 1)]);
        assert_eq!(copy.stats().unknown_parents, 0);
    }

    /// The obvious implementation: each worker's block ids map to the token path they name.
    #[derive(Default, Clone)]
    struct Model {
        workers: HashMap<WorkerId, HashMap<u64, Vec<u64>>>,
    }

    impl Model {
        fn apply(&mut self, worker: WorkerId, data: &KvCacheEventData) {
            let blocks = self.workers.entry(worker).or_default();
            match data {
                KvCacheEventData::Stored(s) => {
                    let mut path = match s.parent_hash {
                        None => Vec::new(),
                        Some(p) => match blocks.get(&p) {
                            Some(path) => path.clone(),
                            None => return,
                        },
                    };
                    for b in &s.blocks {
                        path.push(b.tokens_hash);
                        blocks.insert(b.block_hash, path.clone());
                    }
                }
                KvCacheEventData::Removed(r) => r.block_hashes.iter().for_each(|id| {
                    blocks.remove(id);
                }),
                KvCacheEventData::Cleared => blocks.clear(),
            }
        }

        fn scores(&self, query: &[u64]) -> Vec<(WorkerId, u32)> {
            let mut out: Vec<_> = self
                .workers
                .iter()
                .map(|(&w, blocks)| {
                    let held: std::collections::HashSet<&[u64]> = blocks.values().map(|p| p.as_slice()).collect();
                    (w, (1..=query.len()).take_while(|&k| held.contains(&query[..k])).count() as u32)
                })
                .filter(|&(_, n)| n > 0)
                .collect();
            out.sort_unstable();
            out
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Event(WorkerId, KvCacheEventData),
        RemoveWorker(WorkerId),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        // Few workers, ids and token hashes, so that blocks are shared, ids reused,
        // parents unknown and removals out of order.
        let worker = 1u64..4;
        let stored = (proptest::option::of(0u64..12), proptest::collection::vec((0u64..12, 0u64..3), 1..5)).prop_map(
            |(parent_hash, blocks)| {
                let blocks = blocks
                    .into_iter()
                    .map(|(block_hash, tokens_hash)| KvCacheStoredBlockData { block_hash, tokens_hash })
                    .collect();
                KvCacheEventData::Stored(KvCacheStoreData { parent_hash, blocks })
            },
        );
        let removed = proptest::collection::vec(0u64..12, 1..4)
            .prop_map(|block_hashes| KvCacheEventData::Removed(KvCacheRemoveData { block_hashes }));
        let data = prop_oneof![6 => stored, 3 => removed, 1 => Just(KvCacheEventData::Cleared)];
        prop_oneof![
            20 => (worker.clone(), data).prop_map(|(w, d)| Op::Event(w, d)),
            1 => worker.prop_map(Op::RemoveWorker),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        #[test]
        fn find_matches_agrees_with_the_model(
            ops in proptest::collection::vec(op(), 1..60),
            queries in proptest::collection::vec(proptest::collection::vec(0u64..3, 0..7), 8),
        ) {
            let mut tree = RadixTree::new();
            let mut model = Model::default();
            for (i, op) in ops.iter().enumerate() {
                match op {
                    Op::Event(w, data) => {
                        tree.apply_event(*w, &KvCacheEvent { event_id: i as u64, data: data.clone() });
                        model.apply(*w, data);
                    }
                    Op::RemoveWorker(w) => {
                        tree.remove_worker(*w);
                        model.workers.remove(w);
                    }
                }
                for q in &queries {
                    proptest::prop_assert_eq!(scores(&tree, q), model.scores(q));
                }
            }
            // No node outlives every path through it.
            let live: std::collections::HashSet<&[u64]> =
                model.workers.values().flat_map(|b| b.values().map(|p| p.as_slice())).collect();
            let prefixes: std::collections::HashSet<&[u64]> =
                live.iter().flat_map(|p| (1..=p.len()).map(move |k| &p[..k])).collect();
            proptest::prop_assert_eq!(tree.node_count(), prefixes.len());
            // A snapshot replays into the same answers.
            let mut copy = RadixTree::new();
            for event in tree.dump() {
                copy.apply_router_event(&event);
            }
            proptest::prop_assert_eq!(copy.stats().unknown_parents, 0);
            for q in &queries {
                proptest::prop_assert_eq!(scores(&copy, q), scores(&tree, q));
            }
        }
    }
}

//! The KV router's protocol, which engines (the mocker, Python workers, the vLLM bridge)
//! speak to it: how a block of tokens is hashed, the KV cache events an engine publishes
//! (`stored`, `removed`, `cleared`), the load metrics it publishes, and the event-plane
//! subjects both travel on. The JSON shapes are the reference's (see `docs/kv-routing.md`).
//!
//! Two hashes name a full block of `block_size` tokens:
//! - `tokens_hash`: xxh3-64 (seed 1337, or a seed salted by a LoRA adapter) over the
//!   block's token ids as little-endian u32, for this block alone. The radix tree's
//!   edges are labelled with it, so a path from the root is a token prefix.
//! - `block_hash`: the block's identity in an engine's cache, which `parent_hash` and
//!   `removed` refer to. Engines choose it (vLLM's are opaque); the mocker and the
//!   router's own predictions chain it from the parent ([`chain_hash`]).

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Event name of KV cache events on a worker's component
/// (`namespace.{ns}.component.{c}.kv_events`).
pub const KV_EVENTS_SUBJECT: &str = "kv_events";
/// Event name of load metrics on a worker's component.
pub const LOAD_METRICS_SUBJECT: &str = "load_metrics";

// ---------------------------------------------------------------------------------------
// Block hashing

/// Seed of every block hash without an adapter salt (the reference's router uses the
/// same, so hashes agree with `compute_block_hash_for_seq` there).
pub const HASH_SEED: u64 = 1337;

/// The two hashes of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockHash {
    /// Identity in the cache: chained over the whole prefix up to this block.
    pub block_hash: u64,
    /// Hash of this block's tokens alone.
    pub tokens_hash: u64,
}

/// The seed for blocks of an adapter: requests to different LoRA adapters never share
/// cached blocks, so their hashes must differ. `None` (the base model) is [`HASH_SEED`].
pub fn salted_seed(adapter: Option<&str>) -> u64 {
    match adapter {
        None => HASH_SEED,
        Some(name) => xxh3_64_with_seed(name.as_bytes(), HASH_SEED),
    }
}

#[cfg(target_endian = "little")]
fn tokens_hash_with(_buf: &mut Vec<u8>, tokens: &[u32], seed: u64) -> u64 {
    // SAFETY: u32 has no padding and u8 alignment is 1: the tokens' memory, read as
    // bytes, is their little-endian encoding on this target.
    let bytes = unsafe { std::slice::from_raw_parts(tokens.as_ptr().cast::<u8>(), std::mem::size_of_val(tokens)) };
    xxh3_64_with_seed(bytes, seed)
}

#[cfg(not(target_endian = "little"))]
fn tokens_hash_with(buf: &mut Vec<u8>, tokens: &[u32], seed: u64) -> u64 {
    buf.clear();
    for t in tokens {
        buf.extend_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(buf, seed)
}

/// xxh3-64 (seed 1337) of `tokens` as little-endian u32 bytes.
pub fn compute_tokens_hash(tokens: &[u32]) -> u64 {
    tokens_hash_with(&mut Vec::with_capacity(tokens.len() * 4), tokens, HASH_SEED)
}

/// The chained hash of a block: its tokens hash for the first block, else xxh3-64 of
/// the parent's block hash and this block's tokens hash (16 little-endian bytes).
pub fn chain_hash(parent: Option<u64>, tokens_hash: u64) -> u64 {
    match parent {
        None => tokens_hash,
        Some(parent) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.to_le_bytes());
            bytes[8..].copy_from_slice(&tokens_hash.to_le_bytes());
            xxh3_64_with_seed(&bytes, HASH_SEED)
        }
    }
}

/// The hash of the block following `parent` with these (exactly `block_size`) tokens.
pub fn next_block_hash(parent: Option<u64>, tokens: &[u32]) -> BlockHash {
    let tokens_hash = compute_tokens_hash(tokens);
    BlockHash { block_hash: chain_hash(parent, tokens_hash), tokens_hash }
}

/// The tokens hash of every full block of `tokens` (a partial last block gets none):
/// what [`crate::kv_router::RadixTree::find_matches`] takes. `block_size` 0 gives none.
pub fn compute_block_hash_for_seq(tokens: &[u32], block_size: usize) -> Vec<u64> {
    compute_block_hash_for_seq_salted(tokens, block_size, None)
}

/// [`compute_block_hash_for_seq`] for the blocks of a LoRA adapter ([`salted_seed`]).
pub fn compute_block_hash_for_seq_salted(tokens: &[u32], block_size: usize, adapter: Option<&str>) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let seed = salted_seed(adapter);
    let mut buf = Vec::with_capacity(block_size * 4);
    tokens.chunks_exact(block_size).map(|chunk| tokens_hash_with(&mut buf, chunk, seed)).collect()
}

/// Both hashes of every full block of `tokens`; a partial last block gets none.
pub fn hash_full_blocks(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    chain_block_hashes(&compute_block_hash_for_seq(tokens, block_size))
}

/// Block hashes chained from the root over a sequence of tokens hashes.
pub fn chain_block_hashes(tokens_hashes: &[u64]) -> Vec<BlockHash> {
    let mut parent = None;
    tokens_hashes
        .iter()
        .map(|&tokens_hash| {
            let block_hash = chain_hash(parent, tokens_hash);
            parent = Some(block_hash);
            BlockHash { block_hash, tokens_hash }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// KV cache events: `{"worker_id": 7, "event": {"event_id": 3, "data": {"stored": {...}}}}`

/// One block entering the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoredBlockData {
    /// The engine's identity of the block (what `parent_hash` and `removed` refer to).
    #[serde(deserialize_with = "hash64::one")]
    pub block_hash: u64,
    /// xxh3-64 (seed 1337) of the block's tokens alone ([`compute_block_hash_for_seq`]).
    #[serde(deserialize_with = "hash64::one")]
    pub tokens_hash: u64,
}

/// Blocks stored, in sequence order, each the parent of the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoreData {
    /// The block before the first one (`null` when the first block starts a sequence).
    #[serde(deserialize_with = "hash64::optional")]
    pub parent_hash: Option<u64>,
    /// The stored blocks.
    pub blocks: Vec<KvCacheStoredBlockData>,
}

/// Blocks evicted from the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheRemoveData {
    /// Block hashes of the evicted blocks.
    #[serde(deserialize_with = "hash64::many")]
    pub block_hashes: Vec<u64>,
}

/// What happened to the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvCacheEventData {
    /// `{"stored": {...}}`
    Stored(KvCacheStoreData),
    /// `{"removed": {...}}`
    Removed(KvCacheRemoveData),
    /// `"cleared"`: everything was dropped.
    Cleared,
}

/// An engine's signed 64-bit block id as the router keys it: taken bitwise (its two's
/// complement), so -1 is `u64::MAX`. Every place that takes a signed id (event JSON,
/// the Python bindings) uses this one rule.
pub fn block_id_from_signed(id: i64) -> u64 {
    id as u64
}

/// A stored-blocks report that does not add up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoredBlocksError {
    /// One token count per block hash is expected.
    #[error("num_block_tokens has {counts} entries but block_hashes has {hashes}")]
    CountMismatch {
        /// Entries of `num_block_tokens`.
        counts: usize,
        /// Entries of `block_hashes`.
        hashes: usize,
    },
    /// The blocks claim more tokens than the report carries.
    #[error("num_block_tokens add up to more than len(token_ids)")]
    TooFewTokens,
}

/// The blocks of a stored event an engine reports as token counts (`num_block_tokens`,
/// one per engine block id in `block_hashes`, over `token_ids`). Only full blocks are
/// hashed: the first block shorter (or longer) than `block_size` ends the event, since
/// the index keys blocks by the hash of exactly `block_size` tokens.
pub fn full_stored_blocks(
    token_ids: &[u32],
    num_block_tokens: &[usize],
    block_hashes: &[u64],
    block_size: usize,
    lora_name: Option<&str>,
) -> Result<Vec<KvCacheStoredBlockData>, StoredBlocksError> {
    if num_block_tokens.len() != block_hashes.len() {
        return Err(StoredBlocksError::CountMismatch { counts: num_block_tokens.len(), hashes: block_hashes.len() });
    }
    if num_block_tokens.iter().sum::<usize>() > token_ids.len() {
        return Err(StoredBlocksError::TooFewTokens);
    }
    let mut blocks = Vec::with_capacity(block_hashes.len());
    let mut start = 0;
    for (&n, &block_hash) in num_block_tokens.iter().zip(block_hashes) {
        if n != block_size || n == 0 {
            break;
        }
        let tokens_hash = compute_block_hash_for_seq_salted(&token_ids[start..start + n], n, lora_name)[0];
        blocks.push(KvCacheStoredBlockData { block_hash, tokens_hash });
        start += n;
    }
    Ok(blocks)
}

/// Hashes in events are u64; engines with signed 64-bit ids may send those, taken
/// bitwise ([`block_id_from_signed`]).
mod hash64 {
    use std::fmt;

    use serde::de::{Deserializer, Error, SeqAccess, Visitor};
    use serde::Deserialize;

    /// A u64 that also accepts an i64 (bitwise).
    struct Hash(u64);

    impl<'de> Deserialize<'de> for Hash {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Hash;
                fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                    f.write_str("a 64-bit integer")
                }
                fn visit_u64<E: Error>(self, v: u64) -> Result<Hash, E> {
                    Ok(Hash(v))
                }
                fn visit_i64<E: Error>(self, v: i64) -> Result<Hash, E> {
                    Ok(Hash(super::block_id_from_signed(v)))
                }
            }
            d.deserialize_u64(V)
        }
    }

    pub fn one<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        Hash::deserialize(d).map(|h| h.0)
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        Ok(Option::<Hash>::deserialize(d)?.map(|h| h.0))
    }

    pub fn many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u64>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Vec<u64>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of 64-bit integers")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(Hash(h)) = seq.next_element()? {
                    out.push(h);
                }
                Ok(out)
            }
        }
        d.deserialize_seq(V)
    }
}

/// One numbered event of one worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheEvent {
    /// Increases by one per event of a worker (a gap means events were dropped).
    pub event_id: u64,
    /// The change.
    pub data: KvCacheEventData,
}

/// A worker's KV cache event, as published.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterEvent {
    /// The instance id of the worker's endpoint.
    pub worker_id: u64,
    /// The event.
    pub event: KvCacheEvent,
}

// ---------------------------------------------------------------------------------------
// Load metrics: `{"worker_id": 7, "data_parallel_rank": null, "kv_active_blocks": 3, ...}`

/// A worker's load after a forward pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwardPassMetrics {
    /// Data-parallel rank of the worker, if any.
    pub data_parallel_rank: Option<u32>,
    /// Sequences running.
    pub request_active_slots: u64,
    /// Most sequences that may run.
    pub request_total_slots: u64,
    /// KV blocks in use by running sequences.
    pub kv_active_blocks: u64,
    /// KV blocks in all.
    pub kv_total_blocks: u64,
    /// Requests queued, not yet running.
    pub num_requests_waiting: u64,
    /// `kv_active_blocks / kv_total_blocks`, 0–1.
    pub gpu_cache_usage_perc: f32,
    /// Share of looked-up prompt blocks found in the prefix cache since start, 0–1.
    pub gpu_prefix_cache_hit_rate: f32,
}

/// The published form: `{"worker_id": 7, "data_parallel_rank": null, ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadMetricsEvent {
    /// The instance id of the worker's endpoint.
    pub worker_id: u64,
    /// The metrics, flattened beside `worker_id`.
    #[serde(flatten)]
    pub metrics: ForwardPassMetrics,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_block_id_is_taken_bitwise() {
        assert_eq!(block_id_from_signed(-1), u64::MAX);
        assert_eq!(block_id_from_signed(i64::MIN), 1 << 63);
        assert_eq!(block_id_from_signed(42), 42);
        let removed: KvCacheRemoveData = serde_json::from_str(r#"{"block_hashes":[-1,7]}"#).unwrap();
        assert_eq!(removed.block_hashes, vec![u64::MAX, 7]);
    }

    #[test]
    fn only_full_blocks_of_a_stored_report_are_hashed() {
        let tokens: Vec<u32> = (0..10).collect();
        let blocks = full_stored_blocks(&tokens, &[4, 4, 2], &[10, 11, 12], 4, None).unwrap();
        let expected = compute_block_hash_for_seq(&tokens, 4);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks.iter().map(|b| b.block_hash).collect::<Vec<_>>(), vec![10, 11]);
        assert_eq!(blocks.iter().map(|b| b.tokens_hash).collect::<Vec<_>>(), expected);
        // A short block ends the event even when full ones follow.
        assert_eq!(full_stored_blocks(&tokens, &[4, 2, 4], &[1, 2, 3], 4, None).unwrap().len(), 1);
        let salted = full_stored_blocks(&tokens, &[4], &[1], 4, Some("adapter")).unwrap();
        assert_eq!(salted[0].tokens_hash, compute_block_hash_for_seq_salted(&tokens[..4], 4, Some("adapter"))[0]);
        assert_ne!(salted[0].tokens_hash, expected[0]);
    }

    #[test]
    fn a_stored_report_that_does_not_add_up_is_refused() {
        let tokens: Vec<u32> = (0..8).collect();
        assert_eq!(
            full_stored_blocks(&tokens, &[4], &[1, 2], 4, None),
            Err(StoredBlocksError::CountMismatch { counts: 1, hashes: 2 })
        );
        assert_eq!(full_stored_blocks(&tokens, &[4, 4, 4], &[1, 2, 3], 4, None), Err(StoredBlocksError::TooFewTokens));
    }
    use serde_json::json;

    #[test]
    fn tokens_hash_is_xxh3_1337_over_le_u32() {
        let tokens = [1u32, 2, 3, 0x01020304];
        let mut bytes = Vec::new();
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(compute_tokens_hash(&tokens), xxh3_64_with_seed(&bytes, 1337));
        assert_ne!(compute_tokens_hash(&tokens), xxh3_64_with_seed(&bytes, 0));
        assert_eq!(compute_block_hash_for_seq(&tokens, 4), vec![compute_tokens_hash(&tokens)]);
    }

    #[test]
    fn same_tokens_same_hashes() {
        let tokens: Vec<u32> = (0..64).collect();
        assert_eq!(hash_full_blocks(&tokens, 16), hash_full_blocks(&tokens, 16));
        let hashes = hash_full_blocks(&tokens, 16);
        assert_eq!(hashes.len(), 4);
        assert_eq!(hashes[0].block_hash, hashes[0].tokens_hash);
        let local: Vec<u64> = hashes.iter().map(|h| h.tokens_hash).collect();
        assert_eq!(compute_block_hash_for_seq(&tokens, 16), local);
    }

    #[test]
    fn chained_hash_depends_on_the_parent() {
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[0] = 999; // first block differs, second block's tokens are equal
        let (ha, hb) = (hash_full_blocks(&a, 16), hash_full_blocks(&b, 16));
        assert_eq!(ha[1].tokens_hash, hb[1].tokens_hash);
        assert_ne!(ha[1].block_hash, hb[1].block_hash);
        assert_ne!(chain_hash(Some(1), 7), chain_hash(Some(2), 7));
        assert_ne!(chain_hash(None, 7), chain_hash(Some(0), 7));
        assert_eq!(next_block_hash(Some(ha[0].block_hash), &a[16..32]), ha[1]);
    }

    #[test]
    fn partial_block_is_not_hashed() {
        let tokens: Vec<u32> = (0..40).collect();
        let hashes = hash_full_blocks(&tokens, 16);
        assert_eq!(hashes.len(), 2);
        assert_eq!(hashes, hash_full_blocks(&tokens[..32], 16));
        assert!(hash_full_blocks(&tokens[..15], 16).is_empty());
        assert!(compute_block_hash_for_seq(&tokens, 0).is_empty());
    }

    #[test]
    fn an_adapter_salts_the_hashes() {
        let tokens: Vec<u32> = (0..32).collect();
        let base = compute_block_hash_for_seq(&tokens, 16);
        assert_eq!(compute_block_hash_for_seq_salted(&tokens, 16, None), base);
        let a = compute_block_hash_for_seq_salted(&tokens, 16, Some("adapter-a"));
        let b = compute_block_hash_for_seq_salted(&tokens, 16, Some("adapter-b"));
        assert_ne!(a, base);
        assert_ne!(a, b);
        assert_eq!(a, compute_block_hash_for_seq_salted(&tokens, 16, Some("adapter-a")));
    }

    #[test]
    fn event_json_matches_the_reference_format() {
        let stored = RouterEvent {
            worker_id: 7,
            event: KvCacheEvent {
                event_id: 1,
                data: KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: None,
                    blocks: vec![KvCacheStoredBlockData { block_hash: 5, tokens_hash: 6 }],
                }),
            },
        };
        assert_eq!(
            serde_json::to_value(&stored).unwrap(),
            json!({"worker_id": 7, "event": {"event_id": 1, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 5, "tokens_hash": 6}]}}}})
        );
        let removed = KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: vec![u64::MAX] });
        assert_eq!(serde_json::to_value(&removed).unwrap(), json!({"removed": {"block_hashes": [u64::MAX]}}));
        assert_eq!(serde_json::to_value(KvCacheEventData::Cleared).unwrap(), json!("cleared"));
        let back: RouterEvent = serde_json::from_value(serde_json::to_value(&stored).unwrap()).unwrap();
        assert_eq!(back, stored);
        let issue: KvCacheEvent = serde_json::from_str(
            r#"{"event_id": 7, "data": {"stored": {"parent_hash": null, "blocks": [{"block_hash": 111, "tokens_hash": 5756925433886871916}]}}}"#,
        )
        .unwrap();
        assert_eq!(issue.event_id, 7);
        // Signed ids (some engines') are taken bitwise; anything else is refused.
        let signed: KvCacheEvent = serde_json::from_str(
            r#"{"event_id": 1, "data": {"stored": {"parent_hash": -1, "blocks": [{"block_hash": -2, "tokens_hash": 3}]}}}"#,
        )
        .unwrap();
        let KvCacheEventData::Stored(s) = signed.data else { panic!("not stored") };
        assert_eq!((s.parent_hash, s.blocks[0].block_hash), (Some(u64::MAX), u64::MAX - 1));
        let removed: KvCacheEvent =
            serde_json::from_str(r#"{"event_id": 2, "data": {"removed": {"block_hashes": [-1, 5]}}}"#).unwrap();
        assert_eq!(removed.data, KvCacheEventData::Removed(KvCacheRemoveData { block_hashes: vec![u64::MAX, 5] }));
        assert!(serde_json::from_str::<KvCacheEvent>(r#"{"event_id": 2, "data": {"removed": {"block_hashes": [1.5]}}}"#).is_err());
        assert!(serde_json::from_str::<KvCacheEvent>(r#"{"event_id": 2, "data": {"removed": {"block_hashes": ["a"]}}}"#).is_err());
    }

    #[test]
    fn load_metrics_json_is_flat() {
        let event = LoadMetricsEvent {
            worker_id: 3,
            metrics: ForwardPassMetrics { request_total_slots: 8, kv_total_blocks: 100, ..Default::default() },
        };
        let value = serde_json::to_value(&event).unwrap();
        let expected = json!({
            "worker_id": 3, "data_parallel_rank": null, "request_active_slots": 0,
            "request_total_slots": 8, "kv_active_blocks": 0, "kv_total_blocks": 100,
            "num_requests_waiting": 0, "gpu_cache_usage_perc": 0.0, "gpu_prefix_cache_hit_rate": 0.0
        });
        assert_eq!(value, expected);
        assert_eq!(serde_json::from_value::<LoadMetricsEvent>(value).unwrap(), event);
    }
}

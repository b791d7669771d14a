//! KV cache events as the KV router reads them (JSON on the component's `kv_events`
//! subject): `{"worker_id": 7, "event": {"event_id": 3, "data": {"stored": {...}}}}`.

use serde::{Deserialize, Serialize};

/// One block entering the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoredBlockData {
    /// The engine's (chained) identity of the block.
    pub block_hash: u64,
    /// xxh3-64 (seed 1337) of the block's tokens alone.
    pub tokens_hash: u64,
}

/// Blocks stored, in sequence order, each the parent of the next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheStoreData {
    /// The block before the first one (`null` when the first block starts a sequence).
    pub parent_hash: Option<u64>,
    /// The stored blocks.
    pub blocks: Vec<KvCacheStoredBlockData>,
}

/// Blocks evicted from the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCacheRemoveData {
    /// Block hashes of the evicted blocks.
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_matches_the_router_format() {
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
    }
}

//! The response store on our discovery's key-value store (etcd in a fleet), so that any
//! frontend answers for a response another one created. Each response is one key,
//! [`RESPONSES_PREFIX`]`{id}`, holding JSON with its expiry time; written without a
//! lease (a response outlives the frontend that made it). The TTL is enforced on read,
//! and a sweep, at most once per TTL/10 and over at most [`SWEEP_BATCH`] keys, deletes
//! expired ones.
//!
//! The count is bounded too: each response also has an empty index key,
//! [`INDEX_PREFIX`]`{created_at, 12 digits}/{id}`, so that the responses can be counted
//! and ordered by age without reading them. At most once per [`BOUND_EVERY`], a write
//! lists the index and, past the bound, deletes the oldest responses (by creation
//! second; within one second in id order). Between two checks the bound can be passed
//! by what the frontends write meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_runtime::discovery::Discovery;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::protocol::ResponseObject;
use super::store::{ResponseStore, StoreError, StoreErrorKind, StoredResponse};

/// The discovery keys of stored responses: `v1/responses/{id}`.
pub const RESPONSES_PREFIX: &str = "v1/responses/";
/// The index of stored responses by age: `v1/responses-index/{created_at}/{id}`.
pub const INDEX_PREFIX: &str = "v1/responses-index/";
/// Most often one frontend checks the count bound.
pub(crate) const BOUND_EVERY: Duration = Duration::from_secs(1);
/// Most expired keys one sweep deletes.
pub(crate) const SWEEP_BATCH: usize = 100;

/// What one key holds.
#[derive(Serialize, Deserialize)]
struct Record {
    /// Unix time in milliseconds after which the response is gone.
    expires_at_ms: u64,
    stored: StoredResponse,
}

/// Responses in discovery.
pub(crate) struct DiscoveryStore {
    discovery: Arc<dyn Discovery>,
    ttl: Duration,
    max: usize,
    last_sweep: Mutex<Option<Instant>>,
    last_bound: Mutex<Option<Instant>>,
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(StoreErrorKind::Backend, e.to_string())
}

impl DiscoveryStore {
    /// A store on `discovery` of at most `max` responses, each kept for `ttl`.
    pub(crate) fn new(discovery: Arc<dyn Discovery>, ttl: Duration, max: usize) -> Self {
        DiscoveryStore { discovery, ttl, max: max.max(1), last_sweep: Mutex::new(None), last_bound: Mutex::new(None) }
    }

    fn key(id: &str) -> String {
        format!("{RESPONSES_PREFIX}{id}")
    }

    /// The index key of a response created at `created_at` (Unix seconds).
    fn index_key(created_at: u64, id: &str) -> String {
        format!("{INDEX_PREFIX}{created_at:012}/{id}")
    }

    /// Delete a response and its index key.
    async fn remove(&self, response: &ResponseObject) -> Result<(), StoreError> {
        self.discovery.delete(&Self::key(&response.id)).await.map_err(backend)?;
        self.discovery.delete(&Self::index_key(response.created_at, &response.id)).await.map_err(backend)
    }

    /// Whether `last` is at least `every` ago (and, if so, mark it now).
    fn due(last: &Mutex<Option<Instant>>, every: Duration) -> bool {
        let mut last = last.lock();
        let due = last.is_none_or(|at| at.elapsed() >= every);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// Past the bound, delete the oldest responses (their index keys first in key
    /// order); how many were deleted.
    async fn enforce_bound(&self) -> Result<usize, StoreError> {
        let mut index: Vec<String> =
            self.discovery.get_prefix(INDEX_PREFIX).await.map_err(backend)?.into_iter().map(|kv| kv.key).collect();
        index.sort_unstable();
        let excess = index.len().saturating_sub(self.max);
        for key in &index[..excess] {
            if let Some((_, id)) = key.rsplit_once('/') {
                self.discovery.delete(&Self::key(id)).await.map_err(backend)?;
            }
            self.discovery.delete(key).await.map_err(backend)?;
        }
        Ok(excess)
    }

    fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, format!("bad record: {e}")))
    }

    /// Delete up to [`SWEEP_BATCH`] expired (or unreadable) responses.
    async fn sweep(&self) -> Result<usize, StoreError> {
        let now = now_ms();
        let all = self.discovery.get_prefix(RESPONSES_PREFIX).await.map_err(backend)?;
        let expired = all
            .iter()
            .filter_map(|kv| match Self::decode(&kv.value) {
                Ok(record) if record.expires_at_ms > now => None,
                Ok(record) => Some((kv.key.clone(), Some(record))),
                Err(_) => Some((kv.key.clone(), None)),
            })
            .take(SWEEP_BATCH)
            .collect::<Vec<_>>();
        for (key, record) in &expired {
            match record {
                Some(record) => self.remove(&record.stored.response).await?,
                None => self.discovery.delete(key).await.map_err(backend)?,
            }
        }
        Ok(expired.len())
    }
}

#[async_trait]
impl ResponseStore for DiscoveryStore {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let key = Self::key(&stored.response.id);
        let index_key = Self::index_key(stored.response.created_at, &stored.response.id);
        let record = Record { expires_at_ms: now_ms().saturating_add(ttl_ms), stored };
        let value = serde_json::to_vec(&record).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e.to_string()))?;
        self.discovery.put(&key, Bytes::from(value)).await.map_err(backend)?;
        self.discovery.put(&index_key, Bytes::new()).await.map_err(backend)?;
        if Self::due(&self.last_bound, BOUND_EVERY) {
            if let Err(e) = self.enforce_bound().await {
                tracing::warn!(error = %e, "evicting the oldest responses failed");
            }
        }
        if Self::due(&self.last_sweep, self.ttl / 10) {
            if let Err(e) = self.sweep().await {
                tracing::warn!(error = %e, "sweeping expired responses failed");
            }
        }
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let key = Self::key(id);
        let Some(bytes) = self.discovery.get(&key).await.map_err(backend)? else { return Ok(None) };
        let record = Self::decode(&bytes)?;
        if record.expires_at_ms <= now_ms() {
            self.remove(&record.stored.response).await?;
            return Ok(None);
        }
        Ok(Some(record.stored))
    }

    async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        match self.get(id).await? {
            Some(stored) => {
                self.remove(&stored.response).await?;
                Ok(true)
            }
            None => {
                self.discovery.delete(&Self::key(id)).await.map_err(backend)?;
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::responses::convert::new_response;
    use crate::http::responses::protocol::Status;
    use dynamo_runtime::discovery::{MemDiscovery, MemStore};

    fn stored(id: &str) -> StoredResponse {
        StoredResponse { response: new_response(id, "m", Status::Completed), input: Vec::new(), input_items: Vec::new() }
    }

    #[tokio::test]
    async fn shared_between_frontends_and_expiring() {
        let shared = Arc::new(MemStore::default());
        let one = DiscoveryStore::new(Arc::new(MemDiscovery::new(shared.clone())), Duration::from_secs(60), 100);
        let other = DiscoveryStore::new(Arc::new(MemDiscovery::new(shared.clone())), Duration::from_secs(60), 100);
        one.put(stored("resp_a")).await.unwrap();
        assert_eq!(other.get("resp_a").await.unwrap().map(|s| s.response.id), Some("resp_a".to_string()));
        assert!(other.delete("resp_a").await.unwrap());
        assert!(one.get("resp_a").await.unwrap().is_none());

        let discovery: Arc<dyn Discovery> = Arc::new(MemDiscovery::new(shared));
        let short = DiscoveryStore::new(discovery.clone(), Duration::from_millis(30), 100);
        short.put(stored("resp_b")).await.unwrap();
        short.put(stored("resp_c")).await.unwrap();
        assert!(short.get("resp_b").await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(short.get("resp_b").await.unwrap().is_none(), "expired on read");
        assert!(discovery.get("v1/responses/resp_b").await.unwrap().is_none(), "and deleted");
        assert_eq!(short.sweep().await.unwrap(), 1, "the sweep finds resp_c");
        assert!(discovery.get_prefix(RESPONSES_PREFIX).await.unwrap().is_empty());
        assert!(discovery.get_prefix(INDEX_PREFIX).await.unwrap().is_empty(), "index keys go with them");
    }

    #[tokio::test]
    async fn the_oldest_go_past_the_bound() {
        let discovery: Arc<dyn Discovery> = Arc::new(MemDiscovery::new(Arc::new(MemStore::default())));
        let store = DiscoveryStore::new(discovery.clone(), Duration::from_secs(60), 2);
        for (id, created_at) in [("resp_new", 300), ("resp_old", 100), ("resp_mid", 200)] {
            let mut s = stored(id);
            s.response.created_at = created_at;
            store.put(s).await.unwrap();
        }
        assert_eq!(store.enforce_bound().await.unwrap(), 1);
        assert!(store.get("resp_old").await.unwrap().is_none(), "the oldest by creation goes");
        assert!(store.get("resp_mid").await.unwrap().is_some() && store.get("resp_new").await.unwrap().is_some());
        assert_eq!(discovery.get_prefix(INDEX_PREFIX).await.unwrap().len(), 2);
        assert_eq!(store.enforce_bound().await.unwrap(), 0);
        assert!(store.delete("resp_mid").await.unwrap());
        assert_eq!(discovery.get_prefix(INDEX_PREFIX).await.unwrap().len(), 1, "a delete takes the index key");
    }
}

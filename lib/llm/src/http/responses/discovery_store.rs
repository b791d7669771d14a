//! The response store on our discovery's key-value store (etcd in a fleet), so that any
//! frontend answers for a response another one created. Each response is one key,
//! [`RESPONSES_PREFIX`]`{id}`, holding JSON with its expiry time; written without a
//! lease (a response outlives the frontend that made it). The TTL is enforced on read,
//! and a sweep, at most once per TTL/10 and over at most [`SWEEP_BATCH`] keys, deletes
//! expired ones.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_runtime::discovery::Discovery;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::store::{ResponseStore, StoreError, StoreErrorKind, StoredResponse};

/// The discovery keys of stored responses: `v1/responses/{id}`.
pub const RESPONSES_PREFIX: &str = "v1/responses/";
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
    last_sweep: Mutex<Option<Instant>>,
}

fn now_ms() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
}

fn backend(e: impl std::fmt::Display) -> StoreError {
    StoreError::new(StoreErrorKind::Backend, e.to_string())
}

impl DiscoveryStore {
    /// A store on `discovery` keeping each response for `ttl`.
    pub(crate) fn new(discovery: Arc<dyn Discovery>, ttl: Duration) -> Self {
        DiscoveryStore { discovery, ttl, last_sweep: Mutex::new(None) }
    }

    fn key(id: &str) -> String {
        format!("{RESPONSES_PREFIX}{id}")
    }

    fn decode(bytes: &[u8]) -> Result<Record, StoreError> {
        serde_json::from_slice(bytes).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, format!("bad record: {e}")))
    }

    /// Whether a sweep is due now (and, if so, mark it done).
    fn sweep_due(&self) -> bool {
        let every = self.ttl / 10;
        let mut last = self.last_sweep.lock();
        let due = last.is_none_or(|at| at.elapsed() >= every);
        if due {
            *last = Some(Instant::now());
        }
        due
    }

    /// Delete up to [`SWEEP_BATCH`] expired (or unreadable) responses.
    async fn sweep(&self) -> Result<usize, StoreError> {
        let now = now_ms();
        let all = self.discovery.get_prefix(RESPONSES_PREFIX).await.map_err(backend)?;
        let expired = all
            .iter()
            .filter(|kv| Self::decode(&kv.value).map_or(true, |r| r.expires_at_ms <= now))
            .take(SWEEP_BATCH)
            .map(|kv| kv.key.clone())
            .collect::<Vec<_>>();
        for key in &expired {
            self.discovery.delete(key).await.map_err(backend)?;
        }
        Ok(expired.len())
    }
}

#[async_trait]
impl ResponseStore for DiscoveryStore {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError> {
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        let key = Self::key(&stored.response.id);
        let record = Record { expires_at_ms: now_ms().saturating_add(ttl_ms), stored };
        let value = serde_json::to_vec(&record).map_err(|e| StoreError::new(StoreErrorKind::Corrupt, e.to_string()))?;
        self.discovery.put(&key, Bytes::from(value)).await.map_err(backend)?;
        if self.sweep_due() {
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
            self.discovery.delete(&key).await.map_err(backend)?;
            return Ok(None);
        }
        Ok(Some(record.stored))
    }

    async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let present = self.get(id).await?.is_some();
        self.discovery.delete(&Self::key(id)).await.map_err(backend)?;
        Ok(present)
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
        let one = DiscoveryStore::new(Arc::new(MemDiscovery::new(shared.clone())), Duration::from_secs(60));
        let other = DiscoveryStore::new(Arc::new(MemDiscovery::new(shared.clone())), Duration::from_secs(60));
        one.put(stored("resp_a")).await.unwrap();
        assert_eq!(other.get("resp_a").await.unwrap().map(|s| s.response.id), Some("resp_a".to_string()));
        assert!(other.delete("resp_a").await.unwrap());
        assert!(one.get("resp_a").await.unwrap().is_none());

        let discovery: Arc<dyn Discovery> = Arc::new(MemDiscovery::new(shared));
        let short = DiscoveryStore::new(discovery.clone(), Duration::from_millis(30));
        short.put(stored("resp_b")).await.unwrap();
        short.put(stored("resp_c")).await.unwrap();
        assert!(short.get("resp_b").await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(short.get("resp_b").await.unwrap().is_none(), "expired on read");
        assert!(discovery.get("v1/responses/resp_b").await.unwrap().is_none(), "and deleted");
        assert_eq!(short.sweep().await.unwrap(), 1, "the sweep finds resp_c");
        assert!(discovery.get_prefix(RESPONSES_PREFIX).await.unwrap().is_empty());
    }
}

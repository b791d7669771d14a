//! The in-memory response store (the default): bounded in count, each response kept
//! for a TTL; the oldest go first when the bound is reached.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;

use super::store::{ResponseStore, StoreError, StoredResponse};

/// Responses in this process's memory.
pub(crate) struct MemoryStore {
    max: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// id → (write number, expiry, response).
    entries: HashMap<String, (u64, Instant, StoredResponse)>,
    /// Ids by write number, oldest first; an id written again has a stale entry here,
    /// skipped by its write number.
    order: VecDeque<(u64, String)>,
    writes: u64,
}

impl MemoryStore {
    /// A store of at most `max` responses, each kept for `ttl`.
    pub(crate) fn new(max: usize, ttl: Duration) -> Self {
        MemoryStore { max: max.max(1), ttl, inner: Mutex::new(Inner::default()) }
    }
}

impl Inner {
    /// Drop expired entries and, past `max`, the oldest. Entries expire in write order
    /// (one TTL for all), so only the front of `order` is looked at.
    fn evict(&mut self, max: usize, now: Instant) {
        while let Some((number, id)) = self.order.front() {
            let live = self.entries.get(id).filter(|(n, _, _)| n == number);
            let drop_it = match live {
                None => true,
                Some((_, expires, _)) => *expires <= now || self.entries.len() > max,
            };
            if !drop_it {
                break;
            }
            if live.is_some() {
                self.entries.remove(id);
            }
            self.order.pop_front();
        }
    }
}

#[async_trait]
impl ResponseStore for MemoryStore {
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError> {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        inner.writes += 1;
        let number = inner.writes;
        let id = stored.response.id.clone();
        inner.order.push_back((number, id.clone()));
        inner.entries.insert(id, (number, now + self.ttl, stored));
        inner.evict(self.max, now);
        Ok(())
    }

    async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError> {
        let now = Instant::now();
        let inner = self.inner.lock();
        Ok(inner.entries.get(id).filter(|(_, expires, _)| *expires > now).map(|(_, _, s)| s.clone()))
    }

    async fn delete(&self, id: &str) -> Result<bool, StoreError> {
        let now = Instant::now();
        let mut inner = self.inner.lock();
        let removed = inner.entries.remove(id).is_some_and(|(_, expires, _)| expires > now);
        inner.evict(self.max, now);
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::responses::convert::new_response;
    use crate::http::responses::protocol::Status;

    fn stored(id: &str) -> StoredResponse {
        StoredResponse { response: new_response(id, "m", Status::Completed), input: Vec::new(), input_items: Vec::new() }
    }

    #[tokio::test]
    async fn bounded_in_count_and_time() {
        let store = MemoryStore::new(2, Duration::from_secs(60));
        for id in ["a", "b", "c"] {
            store.put(stored(id)).await.unwrap();
        }
        assert!(store.get("a").await.unwrap().is_none(), "the oldest goes past the bound");
        assert!(store.get("b").await.unwrap().is_some());
        // Writing b again makes it the newest: d evicts c.
        store.put(stored("b")).await.unwrap();
        store.put(stored("d")).await.unwrap();
        assert!(store.get("c").await.unwrap().is_none());
        assert!(store.get("b").await.unwrap().is_some());
        assert!(store.delete("b").await.unwrap());
        assert!(!store.delete("b").await.unwrap());

        let store = MemoryStore::new(10, Duration::from_millis(20));
        store.put(stored("x")).await.unwrap();
        assert!(store.get("x").await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(40)).await;
        assert!(store.get("x").await.unwrap().is_none(), "expired");
        store.put(stored("y")).await.unwrap();
        assert_eq!(store.inner.lock().entries.len(), 1, "the expired one is swept on write");
    }
}

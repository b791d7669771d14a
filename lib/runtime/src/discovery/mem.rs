//! In-process discovery: a map and a broadcast of changes, shared by every runtime in
//! the process that uses the same [`MemStore`].

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{broadcast, mpsc};

use super::known::KnownKeys;
use super::{Discovery, DiscoveryHealth, KeyValue, PrefixWatch, WatchEvent};
use crate::config::DiscoveryBackend;
use crate::error::{Error, ErrorKind, Result};

struct Entry {
    value: Bytes,
    lease: Option<i64>,
}

/// The shared map behind [`MemDiscovery`].
pub struct MemStore {
    entries: Mutex<BTreeMap<String, Entry>>,
    changes: broadcast::Sender<WatchEvent>,
    next_lease: AtomicI64,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore {
            entries: Mutex::new(BTreeMap::new()),
            changes: broadcast::channel(4096).0,
            next_lease: AtomicI64::new(1),
        }
    }
}

impl MemStore {
    /// The process-wide store used when no store is given explicitly.
    pub fn global() -> Arc<MemStore> {
        static GLOBAL: std::sync::OnceLock<Arc<MemStore>> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(Default::default).clone()
    }

    fn snapshot(entries: &BTreeMap<String, Entry>, prefix: &str) -> Vec<KeyValue> {
        entries
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, e)| KeyValue { key: k.clone(), value: e.value.clone() })
            .collect()
    }

    /// The keys under `prefix` now, and a subscription to the changes after them.
    fn snapshot_and_subscribe(
        &self,
        prefix: &str,
    ) -> (Vec<KeyValue>, broadcast::Receiver<WatchEvent>) {
        // Subscribe under the lock so no change falls between snapshot and subscription.
        let entries = self.entries.lock();
        let changes = self.changes.subscribe();
        (Self::snapshot(&entries, prefix), changes)
    }

    fn write(&self, key: &str, value: Bytes, lease: Option<i64>, create: bool) -> Result<()> {
        let mut entries = self.entries.lock();
        if create && entries.contains_key(key) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("key {key} already exists")));
        }
        entries.insert(key.to_string(), Entry { value: value.clone(), lease });
        // Sent under the lock so watchers see changes in write order.
        let _ = self.changes.send(WatchEvent::Put(KeyValue { key: key.to_string(), value }));
        Ok(())
    }

    fn remove_where(&self, pred: impl Fn(&str, &Entry) -> bool) {
        let mut entries = self.entries.lock();
        let doomed: Vec<String> =
            entries.iter().filter(|(k, e)| pred(k, e)).map(|(k, _)| k.clone()).collect();
        for key in doomed {
            entries.remove(&key);
            let _ = self.changes.send(WatchEvent::Delete(key));
        }
    }
}

/// Discovery inside one process.
pub struct MemDiscovery {
    store: Arc<MemStore>,
    lease: i64,
}

impl MemDiscovery {
    /// A participant of `store` with a fresh lease.
    pub fn new(store: Arc<MemStore>) -> Self {
        let lease = store.next_lease.fetch_add(1, Ordering::Relaxed);
        MemDiscovery { store, lease }
    }
}

#[async_trait]
impl Discovery for MemDiscovery {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::Mem
    }

    fn lease_id(&self) -> i64 {
        self.lease
    }

    fn health(&self) -> DiscoveryHealth {
        DiscoveryHealth::Healthy
    }

    async fn put_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.store.write(key, value, Some(self.lease), false)
    }

    async fn create_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.store.write(key, value, Some(self.lease), true)
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        self.store.write(key, value, None, false)
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        Ok(self.store.entries.lock().get(key).map(|e| e.value.clone()))
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        Ok(MemStore::snapshot(&self.store.entries.lock(), prefix))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        self.store.remove_where(|k, _| k == key);
        Ok(())
    }

    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch> {
        let (initial, mut changes) = self.store.snapshot_and_subscribe(prefix);
        let mut known = KnownKeys::new(&initial);
        let (tx, rx) = mpsc::channel(1024);
        let store = self.store.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            loop {
                let received = tokio::select! {
                    _ = tx.closed() => return,
                    received = changes.recv() => received,
                };
                let events = match received {
                    Ok(event) => {
                        let key = match &event {
                            WatchEvent::Put(kv) => &kv.key,
                            WatchEvent::Delete(k) => k,
                        };
                        if !key.starts_with(&prefix) {
                            continue;
                        }
                        known.apply(&event);
                        vec![event]
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        // Changes were dropped: read the prefix again and send what differs.
                        tracing::debug!(missed, prefix = %prefix, "mem discovery watch lagged; re-reading");
                        let (current, fresh) = store.snapshot_and_subscribe(&prefix);
                        changes = fresh;
                        known.resync(current)
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                for event in events {
                    if tx.send(event).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(PrefixWatch { initial, events: rx })
    }

    async fn shutdown(&self) {
        let lease = self.lease;
        self.store.remove_where(|_, e| e.lease == Some(lease));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lease_owned_keys_vanish_on_shutdown() {
        let store = Arc::new(MemStore::default());
        let a = MemDiscovery::new(store.clone());
        let b = MemDiscovery::new(store.clone());
        a.put_leased("x/a", Bytes::from_static(b"1")).await.unwrap();
        a.put("x/keep", Bytes::from_static(b"2")).await.unwrap();
        let mut watch = b.watch_prefix("x/").await.unwrap();
        assert_eq!(watch.initial.len(), 2);
        a.shutdown().await;
        assert_eq!(watch.events.recv().await, Some(WatchEvent::Delete("x/a".into())));
        let keys: Vec<String> =
            b.get_prefix("x/").await.unwrap().into_iter().map(|kv| kv.key).collect();
        assert_eq!(keys, vec!["x/keep"]);
    }

    #[tokio::test]
    async fn create_refuses_existing_and_prefix_is_exact() {
        let d = MemDiscovery::new(Arc::new(MemStore::default()));
        d.create_leased("ep/generate/1", Bytes::new()).await.unwrap();
        let e = d.create_leased("ep/generate/1", Bytes::new()).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        d.put_leased("ep/generate_v2/1", Bytes::new()).await.unwrap();
        assert_eq!(d.get_prefix("ep/generate/").await.unwrap().len(), 1);
    }
}

//! What a watch has told its consumer so far, so that after a gap (a compacted etcd
//! revision, a lagging broadcast, a poll) the watch can send exactly the differences.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{KeyValue, WatchEvent};

/// The key → value map a watch's consumer holds, as far as the watch knows.
#[derive(Debug, Default)]
pub(crate) struct KnownKeys {
    keys: BTreeMap<String, Bytes>,
}

impl KnownKeys {
    /// The consumer's state after receiving `initial`.
    pub(crate) fn new(initial: &[KeyValue]) -> Self {
        KnownKeys { keys: initial.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect() }
    }

    /// Record an event about to be sent.
    pub(crate) fn apply(&mut self, event: &WatchEvent) {
        match event {
            WatchEvent::Put(kv) => {
                self.keys.insert(kv.key.clone(), kv.value.clone());
            }
            WatchEvent::Delete(key) => {
                self.keys.remove(key);
            }
        }
    }

    /// The events that turn the known state into `current` (deletes first, then puts in
    /// key order); the known state becomes `current`.
    pub(crate) fn resync(&mut self, current: Vec<KeyValue>) -> Vec<WatchEvent> {
        let current: BTreeMap<String, Bytes> =
            current.into_iter().map(|kv| (kv.key, kv.value)).collect();
        let mut events: Vec<WatchEvent> = self
            .keys
            .keys()
            .filter(|key| !current.contains_key(*key))
            .map(|key| WatchEvent::Delete(key.clone()))
            .collect();
        for (key, value) in &current {
            if self.keys.get(key) != Some(value) {
                events.push(WatchEvent::Put(KeyValue { key: key.clone(), value: value.clone() }));
            }
        }
        self.keys = current;
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(k: &str, v: &'static str) -> KeyValue {
        KeyValue { key: k.to_string(), value: Bytes::from_static(v.as_bytes()) }
    }

    #[test]
    fn resync_reports_changes_only() {
        let mut known = KnownKeys::default();
        assert_eq!(known.resync(vec![kv("a", "1")]), vec![WatchEvent::Put(kv("a", "1"))]);
        assert_eq!(known.resync(vec![kv("a", "1")]), vec![]);
        assert_eq!(
            known.resync(vec![kv("a", "2"), kv("b", "1")]),
            vec![WatchEvent::Put(kv("a", "2")), WatchEvent::Put(kv("b", "1"))]
        );
        assert_eq!(known.resync(vec![kv("b", "1")]), vec![WatchEvent::Delete("a".into())]);
    }

    #[test]
    fn applied_events_count_as_known() {
        let mut known = KnownKeys::new(&[kv("a", "1"), kv("b", "1")]);
        known.apply(&WatchEvent::Put(kv("c", "1")));
        known.apply(&WatchEvent::Delete("a".into()));
        assert_eq!(known.resync(vec![kv("b", "1"), kv("c", "1")]), vec![]);
    }
}

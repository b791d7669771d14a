//! `file` discovery: a directory shared by the processes of one machine, no service.
//!
//! Layout under `DYN_FILE_KV`:
//!
//! - `leases/<id>`: one file per live process lease. Its content is the owner's TTL in
//!   milliseconds (so processes with different TTLs judge each other correctly); its
//!   mtime is the owner's last heartbeat, refreshed every TTL/3.
//! - `keys/<encoded key>`: one file per key, `<lease id>\n<value bytes>`, lease 0 meaning
//!   unleased. Keys are percent-encoded, so every string maps to one safe file name and
//!   back.
//! - `lock`: `flock`ed around every change, which makes check-then-write sequences
//!   (create, garbage collection) atomic between processes. Readers never take it:
//!   every file appears complete, by rename or link of a finished temp file.
//!
//! An entry is live if it is unleased, or its lease file exists and was touched within
//! that lease's TTL. Readers treat other entries as absent and delete them.

//!
//! Split by concern: [`keys`] (file names of keys), [`store`] (the directory and its
//! locking), [`watch`] (polling prefix watches), [`lease`] (the lease file, driven by
//! the shared lease keeper); the `Discovery` over them is the shared one in `leased.rs`.

mod keys;
mod lease;
mod store;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

pub use self::lease::FileStore;
use self::store::{blocking, Store};
use self::watch::PollingWatch;
use super::known::KnownKeys;
use super::leased::{KvStore, Leased, WatchFeed};
use super::KeyValue;
use crate::config::{DiscoveryBackend, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// Shortest usable TTL: heartbeats every TTL/3 must stay well above scheduling noise.
const MIN_TTL: Duration = Duration::from_millis(300);

/// Discovery through a directory shared by the processes of one machine.
pub type FileDiscovery = Leased<FileStore>;

impl Leased<FileStore> {
    /// Open (creating it if needed) `config.file_kv_dir`, take a lease and start the
    /// heartbeat.
    pub async fn start(config: &RuntimeConfig, cancel: CancellationToken) -> Result<Self> {
        let ttl = config.lease_ttl.max(MIN_TTL);
        let root = config.file_kv_dir.clone();
        let store =
            tokio::task::spawn_blocking(move || Store::open(&root, ttl)).await.map_err(|e| {
                Error::with_source(ErrorKind::Discovery, "a file discovery task failed", e)
            })??;
        let store = Arc::new(store);
        let lease = blocking(&store, |s| s.new_lease()).await?;
        tracing::debug!(lease, dir = %store.root.display(), ?ttl, "file discovery lease taken");
        Ok(Leased::keep(Arc::new(FileStore { store }), lease, ttl, config.lease_loss, cancel))
    }
}

#[async_trait]
impl KvStore for FileStore {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::File
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let k = key.to_string();
        blocking(&self.store, move |st| st.get(&k)).await
    }

    async fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let p = prefix.to_string();
        blocking(&self.store, move |st| st.scan(&p)).await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let k = key.to_string();
        blocking(&self.store, move |st| st.write(&k, 0, &value, false, &[])).await
    }

    async fn remove(&self, key: &str) -> Result<()> {
        let k = key.to_string();
        blocking(&self.store, move |st| st.remove(&k)).await
    }

    async fn watch(self: Arc<Self>, prefix: &str, feed: WatchFeed) -> Result<Vec<KeyValue>> {
        let initial = self.scan(prefix).await?;
        let watch = PollingWatch {
            store: self.store.clone(),
            prefix: prefix.to_string(),
            known: KnownKeys::new(&initial),
            tx: feed.tx,
            alive: feed.alive,
            health: feed.health,
            source: feed.source,
        };
        // Owned by `alive` (and by the receiver): it ends when either goes.
        tokio::spawn(watch.run());
        Ok(initial)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use tokio::time::{sleep, timeout, Instant};

    use super::*;
    use crate::config::LeaseLossPolicy;
    use crate::discovery::{Discovery, DiscoveryHealth, PrefixWatch, WatchEvent};

    fn config(dir: &Path, ttl: Duration, lease_loss: LeaseLossPolicy) -> RuntimeConfig {
        RuntimeConfig {
            discovery: DiscoveryBackend::File,
            file_kv_dir: dir.to_path_buf(),
            lease_ttl: ttl,
            lease_loss,
            ..RuntimeConfig::default()
        }
    }

    async fn start(dir: &Path, ttl: Duration) -> (FileDiscovery, CancellationToken) {
        let cancel = CancellationToken::new();
        let d =
            FileDiscovery::start(&config(dir, ttl, LeaseLossPolicy::Reregister), cancel.clone())
                .await
                .unwrap();
        (d, cancel)
    }

    fn b(s: &'static str) -> Bytes {
        Bytes::from_static(s.as_bytes())
    }

    fn keys(kvs: &[KeyValue]) -> Vec<&str> {
        kvs.iter().map(|kv| kv.key.as_str()).collect()
    }

    async fn next(watch: &mut PrefixWatch, within: Duration) -> WatchEvent {
        timeout(within, watch.events.recv())
            .await
            .expect("no watch event in time")
            .expect("watch ended")
    }

    #[tokio::test]
    async fn put_get_prefix_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let (d, _cancel) = start(dir.path(), Duration::from_secs(10)).await;
        d.put_leased("a/generate/2", b("two")).await.unwrap();
        d.put_leased("a/generate/1", b("one")).await.unwrap();
        d.put("a/config", b("cfg")).await.unwrap();
        d.put_leased("a/generate_v2/x", b("other")).await.unwrap();
        assert_eq!(d.get("a/generate/1").await.unwrap(), Some(b("one")));
        assert_eq!(d.get("a/missing").await.unwrap(), None);
        let found = d.get_prefix("a/generate/").await.unwrap();
        assert_eq!(keys(&found), vec!["a/generate/1", "a/generate/2"]);
        assert_eq!(found[1].value, b("two"));
        assert_eq!(keys(&d.get_prefix("a/").await.unwrap()).len(), 4);

        d.put_leased("a/generate/1", b("uno")).await.unwrap();
        assert_eq!(d.get("a/generate/1").await.unwrap(), Some(b("uno")));
        d.delete("a/generate/1").await.unwrap();
        d.delete("a/generate/1").await.unwrap();
        assert_eq!(d.get("a/generate/1").await.unwrap(), None);

        // Shutdown removes leased keys only.
        d.shutdown().await;
        assert_eq!(keys(&d.get_prefix("a/").await.unwrap()), vec!["a/config"]);
    }

    #[tokio::test]
    async fn create_conflicts_across_instances() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _ca) = start(dir.path(), Duration::from_secs(10)).await;
        let (b2, _cb) = start(dir.path(), Duration::from_secs(10)).await;
        a.create_leased("ep/generate/1", b("a")).await.unwrap();
        let e = a.create_leased("ep/generate/1", b("again")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        let e = b2.create_leased("ep/generate/1", b("b")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists);
        assert_eq!(b2.get("ep/generate/1").await.unwrap(), Some(b("a")));
        // Once the owner gives the key up, it can be created again.
        a.shutdown().await;
        b2.create_leased("ep/generate/1", b("b")).await.unwrap();
        assert_eq!(a.get("ep/generate/1").await.unwrap(), Some(b("b")));
    }

    #[tokio::test]
    async fn instances_see_each_others_keys_and_events() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _ca) = start(dir.path(), Duration::from_secs(10)).await;
        let (w, _cw) = start(dir.path(), Duration::from_secs(10)).await;
        a.put_leased("ns/ep/1", b("one")).await.unwrap();
        let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
        assert_eq!(keys(&watch.initial), vec!["ns/ep/1"]);

        a.put_leased("ns/ep/2", b("two")).await.unwrap();
        a.put_leased("ns/ep_v2/3", b("not mine")).await.unwrap();
        let put = KeyValue { key: "ns/ep/2".into(), value: b("two") };
        assert_eq!(next(&mut watch, Duration::from_secs(2)).await, WatchEvent::Put(put));
        a.delete("ns/ep/2").await.unwrap();
        assert_eq!(
            next(&mut watch, Duration::from_secs(2)).await,
            WatchEvent::Delete("ns/ep/2".into())
        );
        a.shutdown().await;
        assert_eq!(
            next(&mut watch, Duration::from_secs(2)).await,
            WatchEvent::Delete("ns/ep/1".into())
        );
        assert!(w.get_prefix("ns/").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn dead_instance_expires_for_others() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(1);
        let (a, cancel_a) = start(dir.path(), ttl).await;
        let (w, _cw) = start(dir.path(), ttl).await;
        a.put_leased("ns/ep/a", b("a")).await.unwrap();
        w.put_leased("ns/ep/w", b("w")).await.unwrap();
        let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
        assert_eq!(keys(&watch.initial), vec!["ns/ep/a", "ns/ep/w"]);

        // The process "dies": its heartbeat stops without a clean shutdown.
        let dead_lease = a.lease_id();
        cancel_a.cancel();
        drop(a);
        let started = Instant::now();
        let event = next(&mut watch, ttl + Duration::from_secs(2)).await;
        assert_eq!(event, WatchEvent::Delete("ns/ep/a".into()));
        assert!(started.elapsed() >= ttl / 2, "expired too early: {:?}", started.elapsed());
        assert_eq!(w.get("ns/ep/a").await.unwrap(), None);
        // The live instance keeps its key, and the dead lease file was collected.
        assert_eq!(keys(&w.get_prefix("ns/").await.unwrap()), vec!["ns/ep/w"]);
        assert!(!dir.path().join("leases").join(dead_lease.to_string()).exists());
        assert!(dir.path().join("leases").join(w.lease_id().to_string()).exists());
    }

    #[tokio::test]
    async fn lost_lease_is_reregistered() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(1);
        let (a, cancel_a) = start(dir.path(), ttl).await;
        a.put_leased("ns/ep/a", b("a")).await.unwrap();
        a.create_leased("ns/ep/excl", b("x")).await.unwrap();
        let old = a.lease_id();
        // Someone else's garbage collection removed our lease (e.g. after a long pause).
        fs::remove_file(dir.path().join("leases").join(old.to_string())).unwrap();
        let deadline = Instant::now() + Duration::from_secs(3);
        while a.lease_id() == old {
            assert!(Instant::now() < deadline, "lease was not replaced");
            sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(a.get("ns/ep/a").await.unwrap(), Some(b("a")));
        assert_eq!(a.get("ns/ep/excl").await.unwrap(), Some(b("x")));
        assert!(!cancel_a.is_cancelled());
        // The keys now belong to the new lease: they vanish with it.
        a.shutdown().await;
        assert!(a.get_prefix("ns/").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn lost_lease_with_shutdown_policy_cancels_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let cancel = CancellationToken::new();
        let cfg = config(dir.path(), Duration::from_secs(1), LeaseLossPolicy::Shutdown);
        let a = FileDiscovery::start(&cfg, cancel.clone()).await.unwrap();
        a.put_leased("ns/ep/a", b("a")).await.unwrap();
        fs::remove_file(dir.path().join("leases").join(a.lease_id().to_string())).unwrap();
        timeout(Duration::from_secs(3), cancel.cancelled()).await.expect("runtime not cancelled");
        assert_eq!(a.get("ns/ep/a").await.unwrap(), None);
    }

    #[tokio::test]
    async fn unusable_directory_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let cfg = config(&file.join("kv"), Duration::from_secs(1), LeaseLossPolicy::Reregister);
        let e = FileDiscovery::start(&cfg, CancellationToken::new()).await.err().unwrap();
        assert_eq!(e.kind(), ErrorKind::Discovery);
        assert!(e.to_string().contains("not-a-dir"), "{e}");
    }

    /// Replace the directory `dir/name` by a plain file (so every access fails with an
    /// I/O error other than "not found"), returning a guard-less restore closure.
    fn break_dir(dir: &Path, name: &str) -> impl FnOnce() {
        let (path, away) = (dir.join(name), dir.join(format!("{name}.away")));
        fs::rename(&path, &away).unwrap();
        fs::write(&path, b"not a directory").unwrap();
        move || {
            fs::remove_file(&path).unwrap();
            fs::rename(&away, &path).unwrap();
        }
    }

    async fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + within;
        while !cond() {
            assert!(Instant::now() < deadline, "{what}: not within {within:?}");
            sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn unusable_lease_directory_degrades_and_recovers_without_exiting() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(1);
        let (a, cancel_a) = start(dir.path(), ttl).await;
        a.put_leased("ns/ep/a", b("a")).await.unwrap();
        a.create_leased("ns/ep/excl", b("x")).await.unwrap();
        assert_eq!(a.health(), DiscoveryHealth::Healthy);

        let restore = break_dir(dir.path(), "leases");
        wait_for("degraded", Duration::from_secs(3), || !a.health().is_healthy()).await;
        // Past the TTL: the lease counts as lost, the process keeps running.
        sleep(ttl * 2).await;
        let DiscoveryHealth::Degraded { reason, .. } = a.health() else { panic!("healthy") };
        assert!(reason.contains("lost"), "{reason}");
        assert!(!cancel_a.is_cancelled());

        restore();
        wait_for("healthy again", Duration::from_secs(8), || a.health().is_healthy()).await;
        assert_eq!(a.get("ns/ep/a").await.unwrap(), Some(b("a")));
        assert_eq!(a.get("ns/ep/excl").await.unwrap(), Some(b("x")));
        assert!(!cancel_a.is_cancelled());
        a.shutdown().await;
        assert!(a.get_prefix("ns/").await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn watch_survives_an_unreadable_directory() {
        let dir = tempfile::tempdir().unwrap();
        let (a, _ca) = start(dir.path(), Duration::from_secs(10)).await;
        let (w, _cw) = start(dir.path(), Duration::from_secs(10)).await;
        a.put_leased("ns/ep/1", b("one")).await.unwrap();
        let mut watch = w.watch_prefix("ns/ep/").await.unwrap();
        assert_eq!(keys(&watch.initial), vec!["ns/ep/1"]);

        let restore = break_dir(dir.path(), "keys");
        wait_for("degraded", Duration::from_secs(3), || !w.health().is_healthy()).await;
        // Nothing is reported while the directory cannot be read.
        assert!(timeout(Duration::from_millis(300), watch.events.recv()).await.is_err());
        restore();
        wait_for("healthy again", Duration::from_secs(3), || w.health().is_healthy()).await;

        a.put_leased("ns/ep/2", b("two")).await.unwrap();
        let put = KeyValue { key: "ns/ep/2".into(), value: b("two") };
        assert_eq!(next(&mut watch, Duration::from_secs(2)).await, WatchEvent::Put(put));
    }

    #[tokio::test]
    async fn leased_write_while_the_lease_is_lost_is_deferred() {
        let dir = tempfile::tempdir().unwrap();
        let ttl = Duration::from_secs(1);
        let (a, _ca) = start(dir.path(), ttl).await;
        let restore = break_dir(dir.path(), "leases");
        wait_for("lease lost", Duration::from_secs(5), || {
            matches!(a.health(), DiscoveryHealth::Degraded { ref reason, .. } if reason.contains("lost"))
        })
        .await;
        // Recorded now, written on re-registration.
        a.put_leased("ns/ep/later", b("l")).await.unwrap();
        let e = a.create_leased("ns/ep/excl", b("x")).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Discovery);
        restore();
        wait_for("healthy again", Duration::from_secs(8), || a.health().is_healthy()).await;
        assert_eq!(a.get("ns/ep/later").await.unwrap(), Some(b("l")));
        a.create_leased("ns/ep/excl", b("x")).await.unwrap();
    }
}

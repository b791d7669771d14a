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

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::{mpsc, Mutex as AsyncMutex};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Discovery, KeyValue, PrefixWatch, WatchEvent};
use crate::config::{DiscoveryBackend, LeaseLossPolicy, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// How often a watch re-reads the directory. Polling rather than inotify/kqueue: it is
/// portable (including network and container-mounted directories, where change
/// notification is unreliable) and the directories are tiny, so a scan is cheap.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Capacity of a watch's event channel; a full channel pauses polling.
const WATCH_CHANNEL_CAPACITY: usize = 1024;
/// How many times a lost lease is replaced before the runtime is shut down.
const REREGISTER_ATTEMPTS: u32 = 3;
/// Shortest usable TTL: heartbeats every TTL/3 must stay well above scheduling noise.
const MIN_TTL: Duration = Duration::from_millis(300);
/// Temp files older than this were left by a crashed writer and are removed.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);
/// Longest file name on common Linux file systems.
const MAX_FILE_NAME: usize = 255;
/// Bound on waiting for the heartbeat task at shutdown.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(3);
/// Temp files start with a dot so no key file name (always percent-encoded) can clash.
const TEMP_PREFIX: &str = ".tmp-";

/// Percent-encode `key` into a file name: ASCII letters, digits, `-` and `_` stay,
/// every other byte becomes `%XX`.
fn encode_key(key: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The key of a file name written by [`encode_key`]; `None` for any other name.
fn decode_key(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = name.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    let key = String::from_utf8(out).ok()?;
    // Only the canonical spelling counts, so two files can never claim one key.
    (encode_key(&key) == name).then_some(key)
}

fn io_error(what: String, e: io::Error) -> Error {
    Error::with_source(ErrorKind::Discovery, format!("{what}: {e}"), e)
}

fn ignore_not_found(result: io::Result<()>) -> io::Result<()> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// One key file's content.
struct Entry {
    lease: i64,
    value: Bytes,
}

fn parse_entry(bytes: Vec<u8>) -> Option<Entry> {
    let newline = bytes.iter().take(24).position(|&b| b == b'\n')?;
    let lease = std::str::from_utf8(&bytes[..newline]).ok()?.parse().ok()?;
    Some(Entry { lease, value: Bytes::from(bytes).slice(newline + 1..) })
}

/// The directory and its blocking operations (run on the blocking pool).
struct Store {
    root: PathBuf,
    keys: PathBuf,
    leases: PathBuf,
    lock: PathBuf,
    /// This process's TTL, written into its lease files; also the fallback for a lease
    /// file whose content cannot be read.
    ttl: Duration,
}

impl Store {
    fn open(root: &Path, ttl: Duration) -> Result<Store> {
        let store = Store {
            root: root.to_path_buf(),
            keys: root.join("keys"),
            leases: root.join("leases"),
            lock: root.join("lock"),
            ttl,
        };
        for dir in [&store.keys, &store.leases] {
            fs::create_dir_all(dir).map_err(|e| {
                io_error(format!("cannot create the file discovery directory {}", dir.display()), e)
            })?;
        }
        Ok(store)
    }

    /// Exclusive lock over the whole directory, released when the file is closed
    /// (also when the process dies, so a crash cannot wedge the others).
    fn lock(&self) -> Result<File> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.lock)
            .map_err(|e| io_error(format!("cannot open {}", self.lock.display()), e))?;
        file.lock().map_err(|e| io_error(format!("cannot lock {}", self.lock.display()), e))?;
        Ok(file)
    }

    fn key_path(&self, key: &str) -> Result<PathBuf> {
        if key.is_empty() {
            return Err(Error::new(ErrorKind::Discovery, "the empty key cannot be stored"));
        }
        let name = encode_key(key);
        if name.len() > MAX_FILE_NAME {
            return Err(Error::new(
                ErrorKind::Discovery,
                format!(
                    "key {key} is too long for the file discovery backend \
                     ({} bytes encoded, limit {MAX_FILE_NAME})",
                    name.len()
                ),
            ));
        }
        Ok(self.keys.join(name))
    }

    fn lease_path(&self, lease: i64) -> PathBuf {
        self.leases.join(lease.to_string())
    }

    /// A new file in `dir` holding `parts`. Not fsynced: the directory only coordinates
    /// processes of one machine, which all die with it, so durability buys nothing.
    fn write_temp(dir: &Path, parts: &[&[u8]]) -> Result<PathBuf> {
        let name = format!("{TEMP_PREFIX}{}-{:016x}", std::process::id(), rand::random::<u64>());
        let path = dir.join(name);
        let written = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| parts.iter().try_for_each(|p| f.write_all(p)));
        if let Err(e) = written {
            let _ = fs::remove_file(&path);
            return Err(io_error(format!("cannot write {}", path.display()), e));
        }
        Ok(path)
    }

    /// The entry at `path`; `None` if absent, `InvalidData` if not written by us.
    fn read_entry(path: &Path) -> io::Result<Option<Entry>> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        parse_entry(bytes)
            .map(Some)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed discovery entry"))
    }

    /// Whether `lease` is alive: unleased, or its file was touched within its TTL.
    fn lease_live(&self, lease: i64) -> Result<bool> {
        if lease == 0 {
            return Ok(true);
        }
        let path = self.lease_path(lease);
        let meta = match fs::metadata(&path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io_error(format!("cannot stat {}", path.display()), e)),
        };
        let ttl = fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or(self.ttl);
        let touched =
            meta.modified().map_err(|e| io_error(format!("no mtime for {}", path.display()), e))?;
        // A heartbeat "in the future" (clock stepped back) counts as fresh.
        let age = SystemTime::now().duration_since(touched).unwrap_or(Duration::ZERO);
        Ok(age <= ttl)
    }

    /// Write `key` under `lease` (0: unleased). `exclusive`: fail with `AlreadyExists`
    /// if a live entry exists; an expired one is replaced.
    fn write(&self, key: &str, lease: i64, value: &[u8], exclusive: bool) -> Result<()> {
        let path = self.key_path(key)?;
        let header = format!("{lease}\n");
        let temp = Self::write_temp(&self.keys, &[header.as_bytes(), value])?;
        let result = self.install(key, &path, &temp, exclusive);
        if result.is_err() || exclusive {
            // After a link the temp name is a second name of the entry; after a failure
            // it is garbage.
            let _ = fs::remove_file(&temp);
        }
        result
    }

    fn install(&self, key: &str, path: &Path, temp: &Path, exclusive: bool) -> Result<()> {
        let _lock = self.lock()?;
        if !exclusive {
            return fs::rename(temp, path)
                .map_err(|e| io_error(format!("cannot write {}", path.display()), e));
        }
        let replace = match Self::read_entry(path) {
            Ok(None) => false,
            Ok(Some(existing)) => {
                if self.lease_live(existing.lease)? {
                    return Err(Error::new(
                        ErrorKind::AlreadyExists,
                        format!("key {key} already exists"),
                    ));
                }
                true
            }
            // A malformed entry cannot be live either.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => true,
            Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
        };
        if replace {
            ignore_not_found(fs::remove_file(path))
                .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))?;
        }
        // A link never replaces an existing name, so not even a writer that bypassed
        // the lock can be overwritten.
        match fs::hard_link(temp, path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(Error::new(ErrorKind::AlreadyExists, format!("key {key} already exists")))
            }
            Err(e) => Err(io_error(format!("cannot create {}", path.display()), e)),
        }
    }

    fn remove(&self, key: &str) -> Result<()> {
        let path = self.key_path(key)?;
        let _lock = self.lock()?;
        ignore_not_found(fs::remove_file(&path))
            .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))
    }

    /// The live value of `key`; an expired entry is collected and reads as absent.
    fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let path = self.key_path(key)?;
        let entry = match Self::read_entry(&path) {
            Ok(Some(entry)) => entry,
            Ok(None) => return Ok(None),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => return Ok(None),
            Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
        };
        if self.lease_live(entry.lease)? {
            return Ok(Some(entry.value));
        }
        self.collect_logged(&[(key.to_string(), entry.lease)]);
        Ok(None)
    }

    /// Live entries under `prefix`, in key order; expired ones met on the way are
    /// collected.
    fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let listing = fs::read_dir(&self.keys)
            .map_err(|e| io_error(format!("cannot list {}", self.keys.display()), e))?;
        let mut live_leases: HashMap<i64, bool> = HashMap::new();
        let mut live = Vec::new();
        let mut expired = Vec::new();
        for item in listing {
            let item =
                item.map_err(|e| io_error(format!("cannot list {}", self.keys.display()), e))?;
            let name = item.file_name();
            let Some(key) = name.to_str().and_then(decode_key) else { continue };
            if !key.starts_with(prefix) {
                continue;
            }
            let path = item.path();
            let entry = match Self::read_entry(&path) {
                Ok(Some(entry)) => entry,
                // Deleted since the listing.
                Ok(None) => continue,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    tracing::debug!(path = %path.display(), "skipping a malformed discovery entry");
                    continue;
                }
                Err(e) => return Err(io_error(format!("cannot read {}", path.display()), e)),
            };
            let is_live = match live_leases.get(&entry.lease) {
                Some(&known) => known,
                None => {
                    let known = self.lease_live(entry.lease)?;
                    live_leases.insert(entry.lease, known);
                    known
                }
            };
            if is_live {
                live.push(KeyValue { key, value: entry.value });
            } else {
                expired.push((key, entry.lease));
            }
        }
        if !expired.is_empty() {
            self.collect_logged(&expired);
        }
        live.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(live)
    }

    /// [`Store::collect`], logging instead of failing: a read must not fail because
    /// someone else's garbage could not be removed.
    fn collect_logged(&self, expired: &[(String, i64)]) {
        if let Err(e) = self.collect(expired) {
            tracing::warn!(dir = %self.root.display(), error = %e.full_message(), "file discovery garbage collection failed");
        }
    }

    /// Delete expired entries and their lease files. Everything is checked again under
    /// the lock, because the key may have been rewritten (or the lease renewed) since it
    /// was read; a file someone else already removed is fine.
    fn collect(&self, expired: &[(String, i64)]) -> Result<()> {
        let _lock = self.lock()?;
        let mut dead: HashMap<i64, bool> = HashMap::new();
        for (key, lease) in expired {
            let is_dead = match dead.get(lease) {
                Some(&known) => known,
                None => {
                    let known = !self.lease_live(*lease)?;
                    dead.insert(*lease, known);
                    known
                }
            };
            if !is_dead {
                continue;
            }
            let path = self.key_path(key)?;
            if let Ok(Some(entry)) = Self::read_entry(&path) {
                if entry.lease == *lease {
                    ignore_not_found(fs::remove_file(&path))
                        .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))?;
                    tracing::debug!(key = %key, lease, "collected an expired discovery entry");
                }
            }
        }
        for (lease, is_dead) in dead {
            if is_dead {
                let path = self.lease_path(lease);
                ignore_not_found(fs::remove_file(&path))
                    .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))?;
            }
        }
        Ok(())
    }

    /// Create a lease file with a fresh random id.
    fn new_lease(&self) -> Result<i64> {
        let ttl_ms = self.ttl.as_millis().to_string();
        let temp = Self::write_temp(&self.leases, &[ttl_ms.as_bytes()])?;
        // Linked rather than created in place, so no reader ever sees an empty lease file.
        let result = loop {
            let id = rand::random_range(1..=i64::MAX);
            match fs::hard_link(&temp, self.lease_path(id)) {
                Ok(()) => break Ok(id),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    break Err(io_error(
                        format!("cannot create a lease in {}", self.leases.display()),
                        e,
                    ))
                }
            }
        };
        let _ = fs::remove_file(&temp);
        result
    }

    /// Refresh the lease's mtime. Never creates the file: a lease that someone else
    /// collected must stay gone (`NotFound`), so its loss is noticed.
    fn heartbeat(&self, lease: i64) -> io::Result<()> {
        OpenOptions::new().write(true).open(self.lease_path(lease))?.set_modified(SystemTime::now())
    }

    /// Remove the lease file and every key still bound to it.
    fn drop_lease(&self, lease: i64) -> Result<()> {
        let _lock = self.lock()?;
        let listing = fs::read_dir(&self.keys)
            .map_err(|e| io_error(format!("cannot list {}", self.keys.display()), e))?;
        for item in listing {
            let item =
                item.map_err(|e| io_error(format!("cannot list {}", self.keys.display()), e))?;
            if item.file_name().to_str().and_then(decode_key).is_none() {
                continue;
            }
            let path = item.path();
            if let Ok(Some(entry)) = Self::read_entry(&path) {
                if entry.lease == lease {
                    ignore_not_found(fs::remove_file(&path))
                        .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))?;
                }
            }
        }
        let path = self.lease_path(lease);
        ignore_not_found(fs::remove_file(&path))
            .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))
    }

    /// Collect everything expired, including lease files of dead processes that had no
    /// keys, and temp files left by crashed writers.
    fn sweep(&self) -> Result<()> {
        self.scan("")?;
        let mut dead = Vec::new();
        for dir in [&self.leases, &self.keys] {
            let listing = fs::read_dir(dir)
                .map_err(|e| io_error(format!("cannot list {}", dir.display()), e))?;
            for item in listing.flatten() {
                let name = item.file_name();
                let Some(name) = name.to_str() else { continue };
                if name.starts_with(TEMP_PREFIX) {
                    let stale = item
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age > STALE_TEMP_AGE);
                    if stale {
                        let _ = fs::remove_file(item.path());
                    }
                } else if dir == &self.leases {
                    if let Ok(lease) = name.parse::<i64>() {
                        if !self.lease_live(lease)? {
                            dead.push(lease);
                        }
                    }
                }
            }
        }
        if !dead.is_empty() {
            let _lock = self.lock()?;
            for lease in dead {
                if !self.lease_live(lease)? {
                    let path = self.lease_path(lease);
                    ignore_not_found(fs::remove_file(&path))
                        .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))?;
                }
            }
        }
        Ok(())
    }
}

/// Run `f` on the blocking pool: file system calls must not stall the async workers.
async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| Error::with_source(ErrorKind::Discovery, "a file discovery task failed", e))?
}

/// The events that turn the state `known` into `current`; `known` becomes `current`.
fn diff(known: &mut BTreeMap<String, Bytes>, current: Vec<KeyValue>) -> Vec<WatchEvent> {
    let current: BTreeMap<String, Bytes> =
        current.into_iter().map(|kv| (kv.key, kv.value)).collect();
    let mut events: Vec<WatchEvent> = known
        .keys()
        .filter(|key| !current.contains_key(*key))
        .map(|key| WatchEvent::Delete(key.clone()))
        .collect();
    for (key, value) in &current {
        if known.get(key) != Some(value) {
            events.push(WatchEvent::Put(KeyValue { key: key.clone(), value: value.clone() }));
        }
    }
    *known = current;
    events
}

/// A key this process wrote under its lease, kept to write it again under a new lease.
struct Registration {
    value: Bytes,
    /// Written with `create_leased`: on re-registration it must not replace a key another
    /// process created meanwhile.
    exclusive: bool,
}

/// State shared by the handle and its heartbeat task.
struct Shared {
    store: Arc<Store>,
    ttl: Duration,
    lease: AtomicI64,
    /// Leased keys of this process. Leased writes hold this lock across the write so a
    /// re-registration never interleaves with them.
    registrations: AsyncMutex<HashMap<String, Registration>>,
    policy: LeaseLossPolicy,
    /// The runtime's root token; cancelled when the lease cannot be kept.
    root: CancellationToken,
    /// Child of `root`, cancelled when the handle is dropped: ends watches and heartbeat.
    alive: CancellationToken,
    /// Child of `alive`, cancelled by `shutdown()`: ends only the heartbeat.
    heartbeat_stop: CancellationToken,
}

impl Shared {
    fn lease_id(&self) -> i64 {
        self.lease.load(Ordering::Acquire)
    }

    fn dir(&self) -> String {
        self.store.root.display().to_string()
    }

    /// Remove what is left of `lease`, logging failures.
    async fn abandon(&self, lease: i64) {
        if let Err(e) = blocking(&self.store, move |s| s.drop_lease(lease)).await {
            tracing::warn!(lease, dir = %self.dir(), error = %e.full_message(), "could not remove a lost lease");
        }
    }

    /// Replace the lost lease `old` with a new one and write every registration again.
    async fn reregister(&self, old: i64) -> Result<i64> {
        let mut registrations = self.registrations.lock().await;
        // Whatever is left of the old lease goes first: its keys must not outlive it,
        // and everything still registered is written again below.
        self.abandon(old).await;
        let mut last_error = None;
        for attempt in 1..=REREGISTER_ATTEMPTS {
            if attempt > 1 {
                tokio::select! {
                    _ = self.heartbeat_stop.cancelled() => break,
                    _ = sleep(self.ttl / 3) => {}
                }
            }
            if self.heartbeat_stop.is_cancelled() {
                break;
            }
            let wanted: Vec<(String, Bytes, bool)> = registrations
                .iter()
                .map(|(k, r)| (k.clone(), r.value.clone(), r.exclusive))
                .collect();
            let outcome = blocking(&self.store, move |s| {
                let lease = s.new_lease()?;
                let mut taken = Vec::new();
                for (key, value, exclusive) in &wanted {
                    match s.write(key, lease, value, *exclusive) {
                        Ok(()) => {}
                        Err(e) if e.kind() == ErrorKind::AlreadyExists => taken.push(key.clone()),
                        Err(e) => {
                            let _ = s.drop_lease(lease);
                            return Err(e);
                        }
                    }
                }
                Ok((lease, taken))
            })
            .await;
            match outcome {
                Ok((lease, taken)) => {
                    self.lease.store(lease, Ordering::Release);
                    for key in taken {
                        tracing::warn!(
                            key = %key,
                            "another process created this key while our lease was lost; giving it up"
                        );
                        registrations.remove(&key);
                    }
                    return Ok(lease);
                }
                Err(e) => {
                    tracing::warn!(attempt, error = %e.full_message(), "file discovery re-registration attempt failed");
                    last_error = Some(e);
                }
            }
        }
        Err(last_error.unwrap_or_else(|| Error::new(ErrorKind::Shutdown, "heartbeat stopped")))
    }

    /// The heartbeat task: touch the lease file every TTL/3, collect garbage, and apply
    /// the lease-loss policy when the lease is gone.
    async fn heartbeat_loop(self: Arc<Self>) {
        let period = self.ttl / 3;
        let mut last_beat = Instant::now();
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = self.heartbeat_stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let lease = self.lease_id();
            let late = last_beat.elapsed();
            let lost = if late > self.ttl {
                // Others may already have judged the lease dead and acted on it; carrying
                // on as if nothing happened would be a silent half-life.
                Some(format!("the last heartbeat was {late:?} ago (process paused?), over the TTL"))
            } else {
                match blocking(&self.store, move |s| Ok(s.heartbeat(lease))).await {
                    Ok(Ok(())) => {
                        last_beat = Instant::now();
                        if let Err(e) = blocking(&self.store, |s| s.sweep()).await {
                            tracing::warn!(dir = %self.dir(), error = %e.full_message(), "file discovery sweep failed");
                        }
                        None
                    }
                    Ok(Err(e)) if e.kind() == io::ErrorKind::NotFound => Some(
                        "the lease file is gone (another process found it expired)".to_string(),
                    ),
                    // Transient failures are retried; if they last a TTL the lateness check
                    // above declares the lease lost.
                    Ok(Err(e)) => {
                        tracing::warn!(lease, dir = %self.dir(), error = %e, "file discovery heartbeat failed");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(lease, dir = %self.dir(), error = %e.full_message(), "file discovery heartbeat failed");
                        None
                    }
                }
            };
            let Some(reason) = lost else { continue };
            if self.heartbeat_stop.is_cancelled() {
                return;
            }
            tracing::error!(lease, dir = %self.dir(), reason = %reason, "file discovery lease lost");
            match self.policy {
                LeaseLossPolicy::Shutdown => {
                    self.abandon(lease).await;
                    tracing::error!("DYN_LEASE_LOSS=shutdown: shutting the runtime down");
                    self.root.cancel();
                    return;
                }
                LeaseLossPolicy::Reregister => match self.reregister(lease).await {
                    Ok(new) => {
                        tracing::warn!(
                            old = lease,
                            new,
                            "re-registered under a new file discovery lease"
                        );
                        last_beat = Instant::now();
                    }
                    Err(_) if self.heartbeat_stop.is_cancelled() => return,
                    Err(e) => {
                        tracing::error!(
                            dir = %self.dir(),
                            error = %e.full_message(),
                            "could not re-register after losing the lease; shutting the runtime down"
                        );
                        self.root.cancel();
                        return;
                    }
                },
            }
        }
    }
}

/// Discovery through a directory shared by the processes of one machine.
pub struct FileDiscovery {
    shared: Arc<Shared>,
    heartbeat: parking_lot::Mutex<Option<JoinHandle<()>>>,
    /// Dropping the handle stops its tasks; the lease then expires after its TTL.
    _stop_on_drop: DropGuard,
}

impl FileDiscovery {
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

        let alive = cancel.child_token();
        let shared = Arc::new(Shared {
            store,
            ttl,
            lease: AtomicI64::new(lease),
            registrations: AsyncMutex::new(HashMap::new()),
            policy: config.lease_loss,
            root: cancel,
            heartbeat_stop: alive.child_token(),
            alive: alive.clone(),
        });
        let heartbeat = tokio::spawn(shared.clone().heartbeat_loop());
        Ok(FileDiscovery {
            shared,
            heartbeat: parking_lot::Mutex::new(Some(heartbeat)),
            _stop_on_drop: alive.drop_guard(),
        })
    }

    async fn write_leased(&self, key: &str, value: Bytes, exclusive: bool) -> Result<()> {
        let s = &self.shared;
        let mut registrations = s.registrations.lock().await;
        let lease = s.lease_id();
        let (k, v) = (key.to_string(), value.clone());
        blocking(&s.store, move |st| st.write(&k, lease, &v, exclusive)).await?;
        registrations.insert(key.to_string(), Registration { value, exclusive });
        Ok(())
    }
}

#[async_trait]
impl Discovery for FileDiscovery {
    fn backend(&self) -> DiscoveryBackend {
        DiscoveryBackend::File
    }

    fn lease_id(&self) -> i64 {
        self.shared.lease_id()
    }

    async fn put_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.write_leased(key, value, false).await
    }

    async fn create_leased(&self, key: &str, value: Bytes) -> Result<()> {
        self.write_leased(key, value, true).await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        let s = &self.shared;
        // The key is no longer bound to the lease, so re-registration must not touch it.
        let mut registrations = s.registrations.lock().await;
        let k = key.to_string();
        blocking(&s.store, move |st| st.write(&k, 0, &value, false)).await?;
        registrations.remove(key);
        Ok(())
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        let k = key.to_string();
        blocking(&self.shared.store, move |st| st.get(&k)).await
    }

    async fn get_prefix(&self, prefix: &str) -> Result<Vec<KeyValue>> {
        let p = prefix.to_string();
        blocking(&self.shared.store, move |st| st.scan(&p)).await
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let s = &self.shared;
        let mut registrations = s.registrations.lock().await;
        let k = key.to_string();
        blocking(&s.store, move |st| st.remove(&k)).await?;
        registrations.remove(key);
        Ok(())
    }

    async fn watch_prefix(&self, prefix: &str) -> Result<PrefixWatch> {
        let initial = self.get_prefix(prefix).await?;
        let mut known: BTreeMap<String, Bytes> =
            initial.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
        let (tx, rx) = mpsc::channel(WATCH_CHANNEL_CAPACITY);
        let store = self.shared.store.clone();
        let alive = self.shared.alive.clone();
        let prefix = prefix.to_string();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + POLL_INTERVAL, POLL_INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    _ = alive.cancelled() => return,
                    _ = tx.closed() => return,
                    _ = tick.tick() => {}
                }
                let p = prefix.clone();
                let current = match blocking(&store, move |st| st.scan(&p)).await {
                    Ok(current) => current,
                    Err(e) => {
                        tracing::error!(
                            prefix = %prefix,
                            dir = %store.root.display(),
                            error = %e.full_message(),
                            "file discovery watch failed; ending it"
                        );
                        return;
                    }
                };
                for event in diff(&mut known, current) {
                    tokio::select! {
                        _ = alive.cancelled() => return,
                        sent = tx.send(event) => if sent.is_err() { return },
                    }
                }
            }
        });
        Ok(PrefixWatch { initial, events: rx })
    }

    async fn shutdown(&self) {
        let s = &self.shared;
        s.heartbeat_stop.cancel();
        let heartbeat = self.heartbeat.lock().take();
        if let Some(task) = heartbeat {
            if timeout(SHUTDOWN_WAIT, task).await.is_err() {
                tracing::warn!("file discovery heartbeat did not stop within {SHUTDOWN_WAIT:?}");
            }
        }
        let mut registrations = s.registrations.lock().await;
        registrations.clear();
        s.abandon(s.lease_id()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn key_encoding_round_trips_and_rejects_foreign_names() {
        for key in ["a/generate/1", "v1/instances/ns.x/ép", "%41", "..", "-_"] {
            let name = encode_key(key);
            assert!(!name.contains('/') && !name.starts_with('.'), "{name}");
            assert_eq!(decode_key(&name).as_deref(), Some(key));
        }
        assert_eq!(decode_key("%2f"), None, "lower-case hex is not canonical");
        assert_eq!(decode_key("%+1"), None);
        assert_eq!(decode_key(".tmp-1-2"), None);
        assert_eq!(decode_key("%"), None);
    }

    #[test]
    fn diff_reports_changes_only() {
        let kv = |k: &str, v: &'static str| KeyValue { key: k.to_string(), value: b(v) };
        let mut known = BTreeMap::new();
        assert_eq!(diff(&mut known, vec![kv("a", "1")]), vec![WatchEvent::Put(kv("a", "1"))]);
        assert_eq!(diff(&mut known, vec![kv("a", "1")]), vec![]);
        assert_eq!(
            diff(&mut known, vec![kv("a", "2"), kv("b", "1")]),
            vec![WatchEvent::Put(kv("a", "2")), WatchEvent::Put(kv("b", "1"))]
        );
        assert_eq!(diff(&mut known, vec![kv("b", "1")]), vec![WatchEvent::Delete("a".into())]);
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
}

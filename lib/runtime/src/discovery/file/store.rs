//! The on-disk store of the `file` backend: key and lease files, the directory lock,
//! liveness of entries and garbage collection. Everything here blocks; callers run it
//! on the blocking pool through [`blocking`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::keys::{decode_key, encode_key};
use crate::discovery::KeyValue;
use crate::error::{Error, ErrorKind, Result};

/// Temp files older than this were left by a crashed writer and are removed.
const STALE_TEMP_AGE: Duration = Duration::from_secs(60);
/// Longest file name on common Linux file systems.
const MAX_FILE_NAME: usize = 255;
/// Temp files start with a dot so no key file name (always percent-encoded) can clash.
const TEMP_PREFIX: &str = ".tmp-";

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
pub(super) struct Store {
    pub(super) root: PathBuf,
    keys: PathBuf,
    leases: PathBuf,
    lock: PathBuf,
    /// This process's TTL, written into its lease files; also the fallback for a lease
    /// file whose content cannot be read.
    ttl: Duration,
}

impl Store {
    pub(super) fn open(root: &Path, ttl: Duration) -> Result<Store> {
        let store = Store {
            root: root.to_path_buf(),
            keys: root.join("keys"),
            leases: root.join("leases"),
            lock: root.join("lock"),
            ttl,
        };
        store.create_dirs()?;
        Ok(store)
    }

    /// Create the directories (again, if someone removed them).
    fn create_dirs(&self) -> Result<()> {
        for dir in [&self.keys, &self.leases] {
            fs::create_dir_all(dir).map_err(|e| {
                io_error(format!("cannot create the file discovery directory {}", dir.display()), e)
            })?;
        }
        Ok(())
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
    /// if a live entry exists that is bound to none of the leases in `ours`; an expired
    /// one is replaced.
    pub(super) fn write(
        &self,
        key: &str,
        lease: i64,
        value: &[u8],
        exclusive: bool,
        ours: &[i64],
    ) -> Result<()> {
        let path = self.key_path(key)?;
        let header = format!("{lease}\n");
        let temp = Self::write_temp(&self.keys, &[header.as_bytes(), value])?;
        let result = self.install(key, &path, &temp, exclusive, (lease, value, ours));
        if result.is_err() || exclusive {
            // After a link the temp name is a second name of the entry; after a failure
            // it is garbage.
            let _ = fs::remove_file(&temp);
        }
        result
    }

    /// Put the finished `temp` file in place as `path`. `wanted`: the lease and value
    /// being written, and the leases whose entries an exclusive write may replace.
    fn install(
        &self,
        key: &str,
        path: &Path,
        temp: &Path,
        exclusive: bool,
        (lease, value, ours): (i64, &[u8], &[i64]),
    ) -> Result<()> {
        let _lock = self.lock()?;
        if !exclusive {
            return fs::rename(temp, path)
                .map_err(|e| io_error(format!("cannot write {}", path.display()), e));
        }
        let replace = match Self::read_entry(path) {
            Ok(None) => false,
            Ok(Some(existing)) if ours.contains(&existing.lease) => {
                if existing.lease == lease && existing.value == value {
                    // Already in place: checking registrations must not touch it.
                    return Ok(());
                }
                true
            }
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

    pub(super) fn remove(&self, key: &str) -> Result<()> {
        let path = self.key_path(key)?;
        let _lock = self.lock()?;
        ignore_not_found(fs::remove_file(&path))
            .map_err(|e| io_error(format!("cannot remove {}", path.display()), e))
    }

    /// The live value of `key`; an expired entry is collected and reads as absent.
    pub(super) fn get(&self, key: &str) -> Result<Option<Bytes>> {
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
    pub(super) fn scan(&self, prefix: &str) -> Result<Vec<KeyValue>> {
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
    pub(super) fn new_lease(&self) -> Result<i64> {
        self.create_dirs()?;
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
    pub(super) fn heartbeat(&self, lease: i64) -> io::Result<()> {
        OpenOptions::new().write(true).open(self.lease_path(lease))?.set_modified(SystemTime::now())
    }

    /// Remove the lease file and every key still bound to it.
    pub(super) fn drop_lease(&self, lease: i64) -> Result<()> {
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
    pub(super) fn sweep(&self) -> Result<()> {
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
pub(super) async fn blocking<T: Send + 'static>(
    store: &Arc<Store>,
    f: impl FnOnce(&Store) -> Result<T> + Send + 'static,
) -> Result<T> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || f(&store))
        .await
        .map_err(|e| Error::with_source(ErrorKind::Discovery, "a file discovery task failed", e))?
}

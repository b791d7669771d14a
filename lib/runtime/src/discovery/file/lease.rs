//! The `file` backend's side of the shared lease keeper: a lease is a file whose mtime
//! is the heartbeat.

use std::io;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::store::{blocking, Store};
use crate::discovery::lease::LeaseStore;
use crate::error::{Error, ErrorKind, Result};

/// The shared directory as the lease keeper and leased discovery use it: the store of
/// [`super::FileDiscovery`].
pub struct FileStore {
    pub(super) store: Arc<Store>,
}

#[async_trait]
impl LeaseStore for FileStore {
    fn name(&self) -> &'static str {
        "file discovery"
    }

    fn location(&self) -> String {
        self.store.root.display().to_string()
    }

    async fn renew(&self, lease: i64) -> Result<bool> {
        match blocking(&self.store, move |s| Ok(s.heartbeat(lease))).await? {
            Ok(()) => Ok(true),
            // Another process found the lease expired and collected it.
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(Error::with_source(
                ErrorKind::Discovery,
                format!("cannot refresh lease {lease} in {}: {e}", self.location()),
                e,
            )),
        }
    }

    async fn grant(&self) -> Result<i64> {
        blocking(&self.store, |s| s.new_lease()).await
    }

    async fn write(
        &self,
        key: &str,
        value: &Bytes,
        lease: i64,
        exclusive: bool,
        ours: &[i64],
    ) -> Result<bool> {
        let (key, value, ours) = (key.to_string(), value.clone(), ours.to_vec());
        match blocking(&self.store, move |s| s.write(&key, lease, &value, exclusive, &ours)).await {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(e),
        }
    }

    async fn abandon(&self, lease: i64) {
        if let Err(e) = blocking(&self.store, move |s| s.drop_lease(lease)).await {
            tracing::warn!(lease, dir = %self.location(), error = %e, "could not remove a lease given up");
        }
    }

    async fn after_renewal(&self) {
        if let Err(e) = blocking(&self.store, |s| s.sweep()).await {
            tracing::debug!(dir = %self.location(), error = %e, "file discovery sweep failed");
        }
    }
}

//! Placeholder being replaced.
use std::sync::Arc;
use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;
use super::{Discovery, KeyValue, PrefixWatch};
use crate::config::{DiscoveryBackend, RuntimeConfig};
use crate::error::{Error, ErrorKind, Result};

/// etcd discovery (placeholder).
pub struct EtcdDiscovery { _p: Arc<()> }
impl EtcdDiscovery {
    /// Connect.
    pub async fn connect(_c: &RuntimeConfig, _t: CancellationToken) -> Result<Self> {
        Err(Error::new(ErrorKind::Discovery, "etcd not built yet"))
    }
}
#[async_trait]
impl Discovery for EtcdDiscovery {
    fn backend(&self) -> DiscoveryBackend { DiscoveryBackend::Etcd }
    fn lease_id(&self) -> i64 { 0 }
    async fn put_leased(&self, _k: &str, _v: Bytes) -> Result<()> { unimplemented!() }
    async fn create_leased(&self, _k: &str, _v: Bytes) -> Result<()> { unimplemented!() }
    async fn put(&self, _k: &str, _v: Bytes) -> Result<()> { unimplemented!() }
    async fn get(&self, _k: &str) -> Result<Option<Bytes>> { unimplemented!() }
    async fn get_prefix(&self, _p: &str) -> Result<Vec<KeyValue>> { unimplemented!() }
    async fn delete(&self, _k: &str) -> Result<()> { unimplemented!() }
    async fn watch_prefix(&self, _p: &str) -> Result<PrefixWatch> { unimplemented!() }
    async fn shutdown(&self) {}
}

//! Where a resumable stream lives, for a fleet of frontends: the owner announces each of
//! its streams (request id → its HTTP address) and withdraws it when the stream is freed;
//! another frontend asked to resume it looks the owner up and forwards the request.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_runtime::discovery::Discovery;

/// Key prefix of the announcements in discovery's key-value store.
pub const STREAMS_PREFIX: &str = "v1/http/streams/";

/// A directory lookup or announcement failed.
#[derive(Debug, thiserror::Error)]
#[error("stream directory: {0}")]
pub struct DirectoryError(pub String);

/// The shared map of resumable streams to the frontends that own them.
#[async_trait]
pub trait StreamDirectory: Send + Sync + 'static {
    /// Record that `owner` (`host:port` of its HTTP service) holds stream `request_id`.
    async fn announce(&self, request_id: &str, owner: &str) -> Result<(), DirectoryError>;
    /// Forget stream `request_id` (no error if unknown).
    async fn withdraw(&self, request_id: &str) -> Result<(), DirectoryError>;
    /// The owner of stream `request_id`, if any frontend announced it.
    async fn locate(&self, request_id: &str) -> Result<Option<String>, DirectoryError>;
}

/// A [`StreamDirectory`] in discovery's key-value store; the keys are bound to this
/// process's lease, so a frontend that dies takes its announcements with it.
pub struct DiscoveryDirectory {
    discovery: Arc<dyn Discovery>,
}

impl std::fmt::Debug for DiscoveryDirectory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DiscoveryDirectory").field("backend", &self.discovery.backend()).finish()
    }
}

impl DiscoveryDirectory {
    /// A directory in `discovery`.
    pub fn new(discovery: Arc<dyn Discovery>) -> Self {
        DiscoveryDirectory { discovery }
    }
}

fn key(request_id: &str) -> String {
    format!("{STREAMS_PREFIX}{request_id}")
}

#[async_trait]
impl StreamDirectory for DiscoveryDirectory {
    async fn announce(&self, request_id: &str, owner: &str) -> Result<(), DirectoryError> {
        let value = Bytes::copy_from_slice(owner.as_bytes());
        self.discovery.put_leased(&key(request_id), value).await.map_err(|e| DirectoryError(e.to_string()))
    }

    async fn withdraw(&self, request_id: &str) -> Result<(), DirectoryError> {
        self.discovery.delete(&key(request_id)).await.map_err(|e| DirectoryError(e.to_string()))
    }

    async fn locate(&self, request_id: &str) -> Result<Option<String>, DirectoryError> {
        let value = self.discovery.get(&key(request_id)).await.map_err(|e| DirectoryError(e.to_string()))?;
        value
            .map(|v| String::from_utf8(v.to_vec()).map_err(|_| DirectoryError(format!("owner of {request_id:?} is not UTF-8"))))
            .transpose()
    }
}

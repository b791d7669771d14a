//! Where responses are kept for `GET`, `DELETE`, `previous_response_id` and background
//! progress: the [`ResponseStore`] trait; [`super::memory_store`] and
//! [`super::discovery_store`] implement it.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::protocol::ResponseObject;
use crate::protocols::openai::ChatMessage;

/// A kept response: the Response object, the conversation it answered (the earlier
/// turns and its own input, without `instructions`), so that a follow-up can continue
/// it, and its own input items as `GET …/input_items` lists them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredResponse {
    pub(crate) response: ResponseObject,
    pub(crate) input: Vec<ChatMessage>,
    /// Absent in records written before input items were kept.
    #[serde(default)]
    pub(crate) input_items: Vec<serde_json::Value>,
}

/// What went wrong in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreErrorKind {
    /// The backend (discovery) failed.
    Backend,
    /// A stored value could not be read back.
    Corrupt,
}

/// A store failure: its kind and what happened.
#[derive(Debug, Clone, thiserror::Error)]
#[error("response store: {message}")]
pub struct StoreError {
    /// What kind of failure.
    pub kind: StoreErrorKind,
    /// What happened.
    pub message: String,
}

impl StoreError {
    pub(crate) fn new(kind: StoreErrorKind, message: impl Into<String>) -> Self {
        StoreError { kind, message: message.into() }
    }
}

/// A keeper of responses by id. Expired responses are never returned.
#[async_trait]
pub trait ResponseStore: Send + Sync + 'static {
    /// Keep `stored` (replacing a response with the same id).
    async fn put(&self, stored: StoredResponse) -> Result<(), StoreError>;
    /// The response `id`, unless absent or expired.
    async fn get(&self, id: &str) -> Result<Option<StoredResponse>, StoreError>;
    /// Forget `id`; whether it was there.
    async fn delete(&self, id: &str) -> Result<bool, StoreError>;
}

/// A shared store.
pub type SharedResponseStore = Arc<dyn ResponseStore>;

//! Errors of model registration and discovery.

/// Why registering, fetching a card or watching models failed.
#[derive(Debug, thiserror::Error)]
pub enum ModelDiscoveryError {
    /// The runtime (discovery, request plane) failed.
    #[error("{0}")]
    Runtime(#[from] dynamo_runtime::Error),
    /// The model card is missing, too large, or unreadable.
    #[error("model card: {0}")]
    Card(String),
    /// A value could not be (de)serialized.
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A bounded wait ran out.
    #[error("{0}")]
    Timeout(String),
}

//! The record a worker writes to discovery for each model instance it serves, and the
//! key it lives under: `v1/models/{ns}/{comp}/{ep}/{instance_id hex}`.

use dynamo_runtime::EndpointId;
use serde::{Deserialize, Serialize};

use crate::model_card::ModelKind;

/// Discovery prefix of model entries.
pub const MODELS_PREFIX: &str = "v1/models/";

/// One served instance of a model, as stored in discovery (JSON). Small on purpose:
/// the full model card is served by the worker itself (see
/// [`super::card_endpoint_name`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// The model's public name (what clients put in `model`).
    pub name: String,
    /// What the endpoint serves.
    pub kind: ModelKind,
    /// The endpoint that serves requests.
    pub endpoint: EndpointId,
    /// The serving process's instance id.
    pub instance_id: u64,
    /// Checksum of the model card, so frontends can tell workers' cards apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub card_checksum: Option<String>,
    /// The model's context length in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_length: Option<u32>,
    /// Tokens per KV-cache block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_block_size: Option<u32>,
    /// Times a frontend may continue a broken stream on another worker (`backend`
    /// models; `None`: the frontend's `--migration-limit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_limit: Option<u32>,
}

impl ModelEntry {
    /// The discovery key of this entry.
    pub fn key(&self) -> String {
        model_key(&self.endpoint, self.instance_id)
    }
}

/// Escape a name so it is exactly one `/`-separated key segment (as the runtime does
/// for `v1/instances/`).
fn key_segment(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

/// The prefix under which the model entries of `endpoint` live (ends in `/`).
pub fn endpoint_models_prefix(endpoint: &EndpointId) -> String {
    format!(
        "{MODELS_PREFIX}{}/{}/{}/",
        key_segment(&endpoint.namespace),
        key_segment(&endpoint.component),
        key_segment(&endpoint.name)
    )
}

/// The key of the model entry of `instance_id` serving on `endpoint`.
pub fn model_key(endpoint: &EndpointId, instance_id: u64) -> String {
    format!("{}{instance_id:x}", endpoint_models_prefix(endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_json_and_key() {
        let entry = ModelEntry {
            name: "org/model".into(),
            kind: ModelKind::Backend,
            endpoint: EndpointId { namespace: "dyn".into(), component: "a/b".into(), name: "generate".into() },
            instance_id: 255,
            card_checksum: None,
            context_length: Some(4096),
            kv_cache_block_size: None,
            migration_limit: Some(2),
        };
        assert_eq!(entry.key(), "v1/models/dyn/a%2Fb/generate/ff");
        let json = serde_json::to_value(&entry).unwrap();
        assert_eq!(json["kind"], "backend");
        assert_eq!(json["endpoint"]["component"], "a/b");
        assert!(json.get("card_checksum").is_none());
        let back: ModelEntry = serde_json::from_value(json).unwrap();
        assert_eq!(back, entry);
    }
}

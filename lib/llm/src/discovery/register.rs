//! Registering a model served by this process: serve its card, then write its
//! [`ModelEntry`] bound to the process's lease (it disappears when the worker dies).

use dynamo_runtime::Endpoint;

use super::card::serve_card;
use super::error::ModelDiscoveryError;
use super::model_entry::{model_key, ModelEntry};
use crate::model_card::{ModelDeploymentCard, ModelKind};

/// What a worker says about the model it serves on an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRegistration {
    /// The model's public name.
    pub name: String,
    /// What the endpoint takes and yields.
    pub kind: ModelKind,
    /// Checksum of the card, if the card has one.
    pub card_checksum: Option<String>,
    /// Context length in tokens.
    pub context_length: Option<u32>,
    /// Tokens per KV-cache block.
    pub kv_cache_block_size: Option<u32>,
    /// How many times a frontend may continue a broken stream of this model on
    /// another worker (`None`: the frontend's default).
    pub migration_limit: Option<u32>,
}

impl ModelRegistration {
    /// A registration with only a name and a kind.
    pub fn new(name: impl Into<String>, kind: ModelKind) -> Self {
        ModelRegistration {
            name: name.into(),
            kind,
            card_checksum: None,
            context_length: None,
            kv_cache_block_size: None,
            migration_limit: None,
        }
    }

    /// The registration of the model `card` describes: its name, kind, checksum,
    /// context length and KV block size.
    pub fn from_card(card: &ModelDeploymentCard) -> Self {
        ModelRegistration {
            name: card.display_name.clone(),
            kind: card.kind,
            card_checksum: Some(card.checksum()),
            context_length: Some(card.context_length),
            kv_cache_block_size: Some(card.kv_cache_block_size),
            migration_limit: None,
        }
    }
}

/// Register the model `card` describes, served on `endpoint`, with its card: what
/// `dynamo-run in=dyn://` and the bindings' `register_llm` do. `migration_limit`: see
/// [`ModelRegistration::migration_limit`].
pub async fn register_card(
    endpoint: &Endpoint,
    card: &ModelDeploymentCard,
    migration_limit: Option<u32>,
) -> Result<ModelEntry, ModelDiscoveryError> {
    let registration = ModelRegistration { migration_limit, ..ModelRegistration::from_card(card) };
    register_model(endpoint, registration, Some(serde_json::to_value(card)?)).await
}

/// Register the model served on `endpoint`: serve `card` (required for
/// [`ModelKind::Backend`], whose frontends need the tokenizer) on the card endpoint,
/// then write the leased entry. Call after the endpoint itself is serving, so that a
/// frontend that sees the entry can route at once.
pub async fn register_model(
    endpoint: &Endpoint,
    registration: ModelRegistration,
    card: Option<serde_json::Value>,
) -> Result<ModelEntry, ModelDiscoveryError> {
    match card {
        Some(card) => serve_card(endpoint, card).await?,
        None if registration.kind == ModelKind::Backend => {
            return Err(ModelDiscoveryError::Card(format!("a backend model ('{}') must be registered with its card", registration.name)));
        }
        None => {}
    }
    let planes = endpoint.planes();
    let entry = ModelEntry {
        name: registration.name,
        kind: registration.kind,
        endpoint: endpoint.id().clone(),
        instance_id: planes.instance_id(),
        card_checksum: registration.card_checksum,
        context_length: registration.context_length,
        kv_cache_block_size: registration.kv_cache_block_size,
        migration_limit: registration.migration_limit,
    };
    planes.discovery().put_leased(&entry.key(), serde_json::to_vec_pretty(&entry)?.into()).await?;
    tracing::info!(model = entry.name, kind = entry.kind.as_str(), endpoint = %entry.endpoint, "model registered");
    Ok(entry)
}

/// Remove this process's model entry for `endpoint` (frontends stop listing it once no
/// other instance serves it). The card endpoint keeps serving until shutdown.
pub async fn unregister_model(endpoint: &Endpoint) -> Result<(), ModelDiscoveryError> {
    let key = model_key(endpoint.id(), endpoint.planes().instance_id());
    endpoint.planes().discovery().delete(&key).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_registration_from_a_card_carries_its_facts() {
        let card = ModelDeploymentCard::builtin("m").with_kind(ModelKind::Chat).with_kv_cache_block_size(8).unwrap();
        let registration = ModelRegistration::from_card(&card);
        assert_eq!(registration.name, "m");
        assert_eq!(registration.kind, ModelKind::Chat);
        assert_eq!(registration.card_checksum, Some(card.checksum()));
        assert_eq!(registration.context_length, Some(card.context_length));
        assert_eq!(registration.kv_cache_block_size, Some(8));
        assert_eq!(registration.migration_limit, None);
    }
}

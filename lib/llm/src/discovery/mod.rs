//! Model registration and discovery. A worker serves an engine on an endpoint
//! ([`serve_openai_engine`], [`serve_token_engine`]) and registers the model
//! ([`register_model`]): a small leased [`ModelEntry`] under
//! `v1/models/{ns}/{comp}/{ep}/{instance hex}`, and its card on a second endpoint.
//! A frontend's [`ModelWatcher`] follows those entries and fills a
//! [`crate::model_manager::ModelManager`] with remote engines.

mod card;
mod error;
mod linked_stream;
mod migration;
mod model_entry;
mod register;
mod remote;
mod serve;
mod watcher;
pub mod wire;

pub use card::{card_endpoint_name, fetch_card};
pub use error::ModelDiscoveryError;
pub use crate::model_card::ModelKind;
pub use migration::MigrationPolicy;
pub use model_entry::{endpoint_models_prefix, model_key, ModelEntry, MODELS_PREFIX};
pub use register::{register_model, unregister_model, ModelRegistration};
pub use remote::{RemoteOpenAIEngine, RemoteTokenEngine};
pub use serve::{openai_engine_handler, serve_openai_engine, serve_token_engine, token_engine_handler};
pub use watcher::{EngineFactory, ModelWatcher, ModelWatcherHandle, DEFAULT_CARD_TIMEOUT};

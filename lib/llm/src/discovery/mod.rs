//! The model registry. A worker registers the model it serves ([`register_model`]): a
//! small leased [`ModelEntry`] under `v1/models/{ns}/{comp}/{ep}/{instance hex}`, and
//! its card on a second endpoint ([`fetch_card`]). A frontend's
//! [`crate::frontend::ModelWatcher`] follows those entries.

mod card;
mod error;
mod model_entry;
mod register;

pub use card::{card_endpoint_name, fetch_card};
pub use error::ModelDiscoveryError;
pub use crate::model_card::ModelKind;
pub use model_entry::{endpoint_models_prefix, model_key, ModelEntry, MODELS_PREFIX};
pub use register::{register_card, register_model, unregister_model, ModelRegistration};

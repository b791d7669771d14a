//! LLM serving for Python: `register_llm` (build a model card, register the model
//! served on an endpoint) and `run_dynamo_run` (the `dynamo-run` command line).

use std::path::PathBuf;

use dynamo_llm::discovery::{register_model, ModelDiscoveryError, ModelRegistration};
use dynamo_llm::model_card::{CardError, ModelDeploymentCard};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bridge::coroutine;
use crate::errors::{to_py, ConfigError, DynamoError, DynamoTimeoutError};
use crate::runtime::PyEndpoint;

/// Name of the built-in card's model when neither a path nor a name is given
/// (dynamo-run's default too).
const DEFAULT_MODEL_NAME: &str = "dynamo";

/// Parse a kind name ("chat", "completions", "backend") into either `ModelKind` type
/// (the card's and the registration's share the JSON names).
fn parse_kind<K: serde::de::DeserializeOwned>(kind: &str) -> PyResult<K> {
    serde_json::from_value(serde_json::Value::String(kind.to_string())).map_err(|_| {
        PyValueError::new_err(format!("unknown model kind '{kind}': expected 'chat', 'completions' or 'backend'"))
    })
}

pub(crate) fn card_error(e: CardError) -> PyErr {
    ConfigError::new_err(format!("model card: {e}"))
}

fn discovery_error(e: ModelDiscoveryError) -> PyErr {
    match e {
        ModelDiscoveryError::Runtime(e) => to_py(e),
        ModelDiscoveryError::Card(m) => ConfigError::new_err(format!("model card: {m}")),
        ModelDiscoveryError::Timeout(m) => DynamoTimeoutError::new_err(m),
        ModelDiscoveryError::Json(e) => DynamoError::new_err(format!("invalid JSON: {e}")),
    }
}

/// The settings of one `register_llm` call.
pub(crate) struct CardRequest {
    pub model_path: Option<PathBuf>,
    pub model_name: Option<String>,
    pub kind: String,
    pub context_length: Option<u32>,
    pub kv_cache_block_size: Option<u32>,
    pub migration_limit: Option<u32>,
}

impl CardRequest {
    /// Build the card (reading the model folder) and the registration.
    fn build(self) -> PyResult<(ModelRegistration, Option<serde_json::Value>)> {
        let entry_kind = parse_kind(&self.kind)?;
        let card = self.card()?;
        let mut registration = ModelRegistration::new(card.display_name.clone(), entry_kind);
        registration.card_checksum = Some(card.checksum());
        registration.context_length = Some(card.context_length);
        registration.kv_cache_block_size = Some(card.kv_cache_block_size);
        registration.migration_limit = self.migration_limit;
        let json = serde_json::to_value(&card).map_err(|e| DynamoError::new_err(format!("cannot serialize the card: {e}")))?;
        Ok((registration, Some(json)))
    }

    /// Build the model card (reading the model folder): blocking work.
    pub fn card(&self) -> PyResult<ModelDeploymentCard> {
        let card_kind = parse_kind(&self.kind)?;
        let mut card = match &self.model_path {
            Some(path) => {
                if !path.is_dir() {
                    return Err(ConfigError::new_err(format!(
                        "model path {} is not a directory (a HuggingFace model folder with tokenizer.json is expected)",
                        path.display()
                    )));
                }
                ModelDeploymentCard::from_hf_dir(path, self.model_name.as_deref()).map_err(card_error)?
            }
            None => ModelDeploymentCard::builtin(self.model_name.as_deref().unwrap_or(DEFAULT_MODEL_NAME)),
        };
        card = card.with_kind(card_kind);
        if let Some(n) = self.context_length {
            card = card.with_context_length(n).map_err(card_error)?;
        }
        if let Some(n) = self.kv_cache_block_size {
            card = card.with_kv_cache_block_size(n).map_err(card_error)?;
        }
        // A token-level model is useless to a frontend without a tokenizer that loads.
        if self.kind == "backend" {
            card.tokenizer().map_err(card_error)?;
        }
        Ok(card)
    }
}

/// Register the model served on `endpoint` with the discovery plane.
#[pyfunction]
#[pyo3(signature = (endpoint, model_path=None, model_name=None, kind="backend", context_length=None, kv_cache_block_size=None, migration_limit=None))]
pub fn register_llm(
    py: Python<'_>,
    endpoint: &PyEndpoint,
    model_path: Option<PathBuf>,
    model_name: Option<String>,
    kind: &str,
    context_length: Option<u32>,
    kv_cache_block_size: Option<u32>,
    migration_limit: Option<u32>,
) -> PyResult<Py<PyAny>> {
    // Check the kind at once, so that a typo fails at the call rather than when awaited.
    parse_kind::<dynamo_llm::model_card::ModelKind>(kind)?;
    let request = CardRequest { model_path, model_name, kind: kind.to_string(), context_length, kv_cache_block_size, migration_limit };
    let ep = endpoint.inner.clone();
    let registered = endpoint.bridge.awaitable(
        py,
        async move {
            // Reading and parsing a tokenizer.json of a few MB is blocking work.
            let built = tokio::task::spawn_blocking(move || request.build())
                .await
                .map_err(|e| DynamoError::new_err(format!("building the model card failed: {e}")))??;
            let (registration, card) = built;
            register_model(&ep, registration, card).await.map_err(discovery_error)?;
            Ok(())
        },
        |py, ()| Ok(py.None()),
    );
    coroutine(py, registered)
}

/// Run the `dynamo-run` command line (`argv` without the program name) to completion,
/// without the GIL; returns its exit status.
#[pyfunction]
pub fn run_dynamo_run(py: Python<'_>, argv: Vec<String>) -> i32 {
    py.detach(|| dynamo_run::run_cli(argv))
}

/// Add this module's functions to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(register_llm, m)?)?;
    m.add_function(wrap_pyfunction!(run_dynamo_run, m)?)?;
    Ok(())
}

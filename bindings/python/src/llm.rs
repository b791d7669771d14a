//! LLM serving for Python: `register_llm` (build a model card, register the model
//! served on an endpoint) and `run_dynamo_run` (the `dynamo-run` command line).

use std::path::PathBuf;

use dynamo_llm::discovery::{register_card, ModelDiscoveryError};
use dynamo_llm::model_card::{CardError, CardOptions, ModelKind};
use dynamo_llm::parsers::{reasoning_parser as reasoning_parser_named, tool_call_parser as tool_call_parser_named};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::bridge::coroutine;
use crate::errors::{to_py, ConfigError, DynamoError, DynamoTimeoutError};
use crate::runtime::PyEndpoint;

/// Parse a kind name ("chat", "completions", "backend").
fn parse_kind(kind: &str) -> PyResult<ModelKind> {
    serde_json::from_value(serde_json::Value::String(kind.to_string())).map_err(|_| {
        PyValueError::new_err(format!("unknown model kind '{kind}': expected 'chat', 'completions' or 'backend'"))
    })
}

pub(crate) fn card_error(e: CardError) -> PyErr {
    match e {
        CardError::NotADirectory(_) => ConfigError::new_err(e.to_string()),
        e => ConfigError::new_err(format!("model card: {e}")),
    }
}

fn discovery_error(e: ModelDiscoveryError) -> PyErr {
    match e {
        ModelDiscoveryError::Runtime(e) => to_py(e),
        ModelDiscoveryError::Card(m) => ConfigError::new_err(format!("model card: {m}")),
        ModelDiscoveryError::Timeout(m) => DynamoTimeoutError::new_err(m),
        ModelDiscoveryError::Json(e) => DynamoError::new_err(format!("invalid JSON: {e}")),
    }
}

/// Register the model served on `endpoint` with the discovery plane.
#[pyfunction]
#[pyo3(signature = (endpoint, model_path=None, model_name=None, kind="backend", context_length=None, kv_cache_block_size=None, migration_limit=None, tool_call_parser=None, reasoning_parser=None, chat_template=None))]
#[allow(clippy::too_many_arguments)]
pub fn register_llm(
    py: Python<'_>,
    endpoint: &PyEndpoint,
    model_path: Option<PathBuf>,
    model_name: Option<String>,
    kind: &str,
    context_length: Option<u32>,
    kv_cache_block_size: Option<u32>,
    migration_limit: Option<u32>,
    tool_call_parser: Option<String>,
    reasoning_parser: Option<String>,
    chat_template: Option<PathBuf>,
) -> PyResult<Py<PyAny>> {
    // Check the kind and parser names at once, so that a typo fails at the call rather
    // than when awaited.
    if let Some(name) = &tool_call_parser {
        tool_call_parser_named(name, None).map_err(|e| ConfigError::new_err(e.to_string()))?;
    }
    if let Some(name) = &reasoning_parser {
        reasoning_parser_named(name, true).map_err(|e| ConfigError::new_err(e.to_string()))?;
    }
    let options = CardOptions {
        model_path,
        model_name,
        kind: parse_kind(kind)?,
        context_length,
        kv_cache_block_size,
        tool_call_parser,
        reasoning_parser,
        chat_template,
    };
    let ep = endpoint.inner.clone();
    let registered = endpoint.bridge.awaitable(
        py,
        async move {
            // Reading and parsing a tokenizer.json of a few MB is blocking work.
            let card = tokio::task::spawn_blocking(move || options.build())
                .await
                .map_err(|e| DynamoError::new_err(format!("building the model card failed: {e}")))?
                .map_err(card_error)?;
            register_card(&ep, &card, migration_limit).await.map_err(discovery_error)?;
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

//! `in=dyn://ns.comp.ep`: serve the local engine on that endpoint and register its
//! model, so that frontends (`in=http out=dyn`, anywhere) discover it; run until
//! SIGINT/SIGTERM, then leave gracefully (the model entry goes, in-flight streams drain).
//! Readiness (`/ready` with `DYN_SYSTEM_ENABLED`): the readiness mark is held until the
//! model is registered and the engine answered a one-token request (`probe.rs`).
//!
//! - A token engine (`echo_core`, `mocker`) is served with `serve_token_engine` and
//!   registered as a `backend` model with its card, so the frontend runs the
//!   preprocessor; the mocker publishes KV events and load metrics on the component.
//! - `--role decode` (mocker): the engine is wrapped in a `DisaggDecodeEngine` that sends
//!   long prefills to the prefill workers; `--role prefill` serves prefill jobs on the
//!   endpoint and registers no model (docs/disagg.md).
//! - `echo_full` is served with `serve_openai_engine` and registered as a `chat` model
//!   (with its card too), which frontends route both chat and completions requests to.

use std::sync::Arc;

use dynamo_llm::disagg::{
    default_prefill_endpoint, serve_prefill_worker, DisaggDecodeEngine, DisaggMetrics, DisaggRole, KvHandoff, PrefillQueue, PrefillQueueKind,
};
use dynamo_llm::discovery::register_card;
use dynamo_llm::remote::{serve_openai_engine, serve_token_engine};
use dynamo_llm::engines::mocker::MockerPublisher;
use dynamo_llm::engine::TokenEngine;
use dynamo_runtime::{DistributedRuntime, EndpointId};
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::flags::{Output, RunConfig};
use crate::local::{LocalEngine, LocalModel};
use crate::output;

/// Serve on `id` until `cancel` fires (or the runtime shuts itself down).
pub async fn run(config: &RunConfig, id: &EndpointId, cancel: CancellationToken) -> Result<(), RunError> {
    let runtime = DistributedRuntime::from_env().await?;
    let mut local = None;
    let result = serve(config, id, &runtime, &mut local, cancel).await;
    runtime.shutdown().await;
    if let Some(local) = local {
        local.shutdown().await;
    }
    result
}

async fn serve(
    config: &RunConfig,
    id: &EndpointId,
    runtime: &DistributedRuntime,
    local: &mut Option<LocalModel>,
    cancel: CancellationToken,
) -> Result<(), RunError> {
    let endpoint =
        runtime.namespace(id.namespace.clone())?.component(id.component.clone())?.endpoint(id.name.clone())?;
    let publisher = (config.output == Output::Mocker)
        .then(|| MockerPublisher::new(endpoint.component().clone(), runtime.instance_id()));
    let model = local.insert(LocalModel::build(config, publisher)?);
    let card = &model.card;
    let role = config.disagg.role;
    let handoff = || -> Result<Arc<dyn KvHandoff>, RunError> {
        match model.mocker() {
            Some(mocker) => Ok(mocker.clone()),
            None => Err(RunError::Usage(format!("--role {} needs out=mocker", role.as_str()))),
        }
    };
    if role == DisaggRole::Prefill {
        let metrics = DisaggMetrics::register(runtime)?;
        let worker = serve_prefill_worker(&endpoint, handoff()?, &config.disagg, metrics).await?;
        output::status(&format!(
            "serving prefill jobs (out={}, role prefill) on dyn://{id}, instance {:x}",
            config.output.as_str(),
            runtime.instance_id()
        ));
        let result = wait_for_stop(runtime, cancel).await;
        worker.shutdown().await;
        return result;
    }
    let mut role_note = format!("role {}", role.as_str());
    runtime.set_ready(false);
    match &model.engine {
        LocalEngine::OpenAI(engine) => serve_openai_engine(&endpoint, engine.clone()).await?,
        LocalEngine::Tokens(engine) => {
            let engine: Arc<dyn TokenEngine> = if role == DisaggRole::Decode {
                let prefill_id = match &config.prefill_endpoint {
                    Some(id) => id.clone(),
                    None => default_prefill_endpoint(&id.namespace)?,
                };
                let queue = PrefillQueue::connect(runtime, &prefill_id).await?;
                let transport = match queue.kind() {
                    PrefillQueueKind::RequestPlane => "request plane",
                    PrefillQueueKind::JetStream => "NATS JetStream",
                };
                role_note = format!("role decode, prefill queue on {transport} to dyn://{prefill_id}");
                let metrics = DisaggMetrics::register(runtime)?;
                Arc::new(DisaggDecodeEngine::new(handoff()?, queue, config.disagg.clone(), metrics))
            } else {
                engine.clone()
            };
            serve_token_engine(&endpoint, engine).await?;
        }
    }
    register_card(&endpoint, card, config.migration_limit).await?;
    super::probe::engine_answers(&model.engine, &card.display_name).await?;
    runtime.set_ready(true);
    output::status(&format!(
        "serving model '{}' ({}, out={}, {}) on dyn://{id}, instance {:x}",
        card.display_name,
        card.kind,
        config.output.as_str(),
        role_note,
        runtime.instance_id()
    ));
    wait_for_stop(runtime, cancel).await
}

/// Until `cancel` fires (Ok) or the runtime shuts itself down (an error).
async fn wait_for_stop(runtime: &DistributedRuntime, cancel: CancellationToken) -> Result<(), RunError> {
    let stopped_below = runtime.cancel_token();
    tokio::select! {
        _ = cancel.cancelled() => Ok(()),
        _ = stopped_below.cancelled() => Err(RunError::Runtime(dynamo_runtime::Error::new(
            dynamo_runtime::ErrorKind::Shutdown,
            "the runtime shut down on its own (lease lost?)",
        ))),
    }
}

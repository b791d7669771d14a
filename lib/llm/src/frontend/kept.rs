//! Kept models remembered in discovery, for a frontend that starts while the fleet is at
//! zero (a cold frontend). A frontend with `--keep-models` records each model it serves
//! under `v1/kept-models/{name}` (the model's entry, without a lease, so the record
//! outlives every worker and every frontend). A frontend with `--keep-models` that finds
//! a record for a model no worker registers lists the model at once with a [`ColdEngine`]:
//! its requests count as demand at zero (what the planner starts a worker from) and wait,
//! bounded by the zero-wait, until a worker registers and the watcher builds the model's
//! real engine, to which they are then handed; past the bound they get 503 +
//! `Retry-After` ([`NoWorkerError`]), as at zero workers on a warm frontend.
//!
//! A record stays until it is deleted from discovery (`v1/kept-models/{name}`): keeping a
//! model listed is the operator's choice, not something a frontend may forget.

use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use dynamo_runtime::discovery::Discovery;

use crate::discovery::ModelEntry;
use crate::engine::{ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext};
use crate::model_manager::{EngineKind, ModelManager, WaitMetrics, Waiting};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

use super::scale_to_zero::NoWorkerError;

/// Where kept models are recorded in discovery.
pub const KEPT_MODELS_PREFIX: &str = "v1/kept-models/";

/// The discovery key of the record of the kept model `name`.
pub(crate) fn kept_key(name: &str) -> String {
    format!("{KEPT_MODELS_PREFIX}{name}")
}

/// Record `entry`'s model as kept (an unleased key: it outlives this process).
pub(crate) async fn record(discovery: &dyn Discovery, entry: &ModelEntry) -> dynamo_runtime::Result<()> {
    let value = serde_json::to_vec(entry).map_err(|e| {
        dynamo_runtime::Error::new(dynamo_runtime::ErrorKind::Serialization, format!("cannot encode the entry of '{}': {e}", entry.name))
    })?;
    discovery.put(&kept_key(&entry.name), Bytes::from(value)).await
}

/// The kept models recorded in discovery; a malformed record is logged and skipped.
pub(crate) async fn recorded(discovery: &dyn Discovery) -> dynamo_runtime::Result<Vec<ModelEntry>> {
    let records = discovery.get_prefix(KEPT_MODELS_PREFIX).await?;
    Ok(records
        .into_iter()
        .filter_map(|kv| match serde_json::from_slice::<ModelEntry>(&kv.value) {
            Ok(entry) => Some(entry),
            Err(e) => {
                tracing::warn!(key = kv.key, error = %e, "ignoring a malformed kept-model record");
                None
            }
        })
        .collect())
}

/// The engine of a kept model that no worker has registered since this frontend started:
/// a request waits (bounded) for the model's real engine and is handed to it.
pub(crate) struct ColdEngine {
    manager: Weak<ModelManager>,
    model: String,
    route: EngineKind,
    wait: Duration,
    metrics: WaitMetrics,
}

impl ColdEngine {
    /// The cold engine of `model` on `route` in `manager`; requests wait up to `wait`.
    pub(crate) fn new(manager: &Arc<ModelManager>, model: &str, route: EngineKind, wait: Duration) -> Self {
        let metrics = manager.waits().clone();
        ColdEngine { manager: Arc::downgrade(manager), model: model.to_string(), route, wait, metrics }
    }

    /// The model's real engine, once the watcher has built it in this one's place.
    fn built(&self) -> Option<Arc<dyn OpenAIEngine>> {
        let engine = self.manager.upgrade()?.engine(&self.model, self.route).ok()?;
        let is_me = std::ptr::eq(Arc::as_ptr(&engine) as *const (), self as *const Self as *const ());
        (!is_me).then_some(engine)
    }

    /// Wait for the real engine: [`NoWorkerError`] after the bound, or at once when the
    /// request is stopped meanwhile.
    async fn engine(&self, ctx: &RequestContext) -> Result<Arc<dyn OpenAIEngine>, EngineError> {
        let label = [self.model.as_str()];
        self.metrics.arrivals.with_label_values(&label).inc();
        let _waiting = Waiting::new(self.metrics.waiting.with_label_values(&label));
        let Some(manager) = self.manager.upgrade() else {
            return Err(EngineError::Unavailable("the frontend is shutting down".to_string()));
        };
        let mut added = manager.engine_added();
        drop(manager);
        let deadline = tokio::time::sleep(self.wait);
        tokio::pin!(deadline);
        loop {
            if let Some(engine) = self.built() {
                return Ok(engine);
            }
            tokio::select! {
                changed = added.changed() => {
                    if changed.is_err() {
                        return Err(EngineError::Unavailable("the frontend is shutting down".to_string()));
                    }
                }
                _ = &mut deadline => return Err(NoWorkerError { model: self.model.clone(), waited: self.wait }.into()),
                _ = ctx.stopped() => {
                    return Err(EngineError::Unavailable(format!("the request for model '{}' was stopped while it waited for a worker", self.model)));
                }
            }
        }
    }
}

#[async_trait]
impl OpenAIEngine for ColdEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        self.engine(&ctx).await?.chat(request, ctx).await
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        self.engine(&ctx).await?.completion(request, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::EchoFull;

    fn ctx() -> RequestContext {
        RequestContext::new("cold-test")
    }

    #[tokio::test]
    async fn a_request_waits_for_the_real_engine_and_is_handed_to_it() {
        let manager = Arc::new(ModelManager::new());
        let cold: Arc<dyn OpenAIEngine> = Arc::new(ColdEngine::new(&manager, "m", EngineKind::Completions, Duration::from_secs(10)));
        manager.add_engine("m", EngineKind::Completions, cold.clone(), None);
        let waiting = tokio::spawn({
            let cold = cold.clone();
            async move {
                let request: CompletionRequest = serde_json::from_value(serde_json::json!({"model": "m", "prompt": "hi"})).unwrap();
                cold.completion(request, ctx()).await.map(|_| ())
            }
        });
        // Another engine (not the real one's route) does not release it.
        manager.add_engine("other", EngineKind::Completions, Arc::new(EchoFull::new(Duration::ZERO)), None);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(manager.waits().waiting.with_label_values(&["m"]).get(), 1);
        manager.add_engine("m", EngineKind::Completions, Arc::new(EchoFull::new(Duration::ZERO)), None);
        tokio::time::timeout(Duration::from_secs(5), waiting).await.unwrap().unwrap().unwrap();
        assert_eq!(manager.waits().arrivals.with_label_values(&["m"]).get(), 1);
        assert_eq!(manager.waits().waiting.with_label_values(&["m"]).get(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_engine_built_the_request_is_refused_after_the_bound() {
        let manager = Arc::new(ModelManager::new());
        let cold: Arc<dyn OpenAIEngine> = Arc::new(ColdEngine::new(&manager, "m", EngineKind::Chat, Duration::from_secs(3)));
        manager.add_engine("m", EngineKind::Chat, cold.clone(), None);
        let request: ChatCompletionRequest =
            serde_json::from_value(serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})).unwrap();
        let err = cold.chat(request, ctx()).await.err().expect("refused");
        assert_eq!(err.status(), 503);
        assert!(err.to_string().contains("model 'm' has no worker"), "{err}");
    }
}

//! Scale to zero at the frontend (`--keep-models`): a discovered model stays listed
//! after its last worker leaves, and a request for it waits — bounded by the zero-wait —
//! for a worker to register, then is served; past the bound it is refused with 503 and
//! `Retry-After` ([`NoWorkerError`]). Every request that finds no worker is demand a
//! planner can read while the fleet is at zero: `dynamo_frontend_requests_without_workers_total`
//! counts them and `dynamo_frontend_requests_waiting_for_workers` holds those waiting now.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use dynamo_runtime::Client;

use crate::engine::{ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext};
use crate::model_manager::{WaitMetrics, Waiting};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

/// Default bound on a request's wait for a worker of a model at zero workers.
pub const DEFAULT_ZERO_WAIT: Duration = Duration::from_secs(30);

/// A request for a model with no worker, refused after waiting `waited` for one (503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("model '{model}' has no worker (scaled to zero): none registered within {waited:?}; retry later")]
pub struct NoWorkerError {
    /// The model asked for.
    pub model: String,
    /// How long the request waited.
    pub waited: Duration,
}

impl From<NoWorkerError> for EngineError {
    fn from(e: NoWorkerError) -> Self {
        EngineError::Unavailable(e.to_string())
    }
}

/// An engine of a kept model: waits (bounded) for a worker when none is registered,
/// then hands the request to the engine it wraps.
pub(crate) struct ZeroWaitEngine {
    inner: Arc<dyn OpenAIEngine>,
    client: Client,
    model: String,
    wait: Duration,
    metrics: WaitMetrics,
}

impl ZeroWaitEngine {
    /// `inner` sends with `client` (the model's endpoint); a request finding no instance
    /// waits up to `wait` for one.
    pub(crate) fn new(inner: Arc<dyn OpenAIEngine>, client: Client, model: &str, wait: Duration, metrics: WaitMetrics) -> Self {
        ZeroWaitEngine { inner, client, model: model.to_string(), wait, metrics }
    }

    /// Return once a worker is registered; [`NoWorkerError`] after the bound, or at once
    /// when the request is stopped meanwhile.
    async fn worker(&self, ctx: &RequestContext) -> Result<(), EngineError> {
        if !self.client.instance_ids().is_empty() {
            return Ok(());
        }
        self.metrics.arrivals.with_label_values(&[self.model.as_str()]).inc();
        let _waiting = Waiting::new(self.metrics.waiting.with_label_values(&[self.model.as_str()]));
        let refused = || NoWorkerError { model: self.model.clone(), waited: self.wait };
        tokio::select! {
            found = self.client.wait_for_instances(Some(self.wait)) => found.map(|_| ()).map_err(|_| refused().into()),
            _ = ctx.stopped() => Err(EngineError::Unavailable(format!("the request for model '{}' was stopped while it waited for a worker", self.model))),
        }
    }
}

#[async_trait]
impl OpenAIEngine for ZeroWaitEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        self.worker(&ctx).await?;
        self.inner.chat(request, ctx).await
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        self.worker(&ctx).await?;
        self.inner.completion(request, ctx).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_a_503_naming_the_model_and_the_bound() {
        let e: EngineError = NoWorkerError { model: "m".into(), waited: Duration::from_secs(2) }.into();
        assert_eq!(e.status(), 503);
        assert!(e.to_string().contains("model 'm' has no worker") && e.to_string().contains("2s"), "{e}");
    }
}

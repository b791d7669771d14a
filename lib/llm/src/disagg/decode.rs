//! The decode role: a [`TokenEngine`] over a [`KvHandoff`] engine that, before
//! generating, has the prompt prefilled on a prefill worker when the decision rule
//! says so, receiving its KV; otherwise (or when the remote prefill fails or times
//! out) the engine prefills locally as usual. Every remote wait is bounded by
//! `remote_prefill_timeout`.

use std::sync::Arc;

use async_trait::async_trait;

use super::config::DisaggConfig;
use super::handoff::{KvHandoff, PrefillJob};
use super::metrics::{DisaggMetrics, PrefillSource};
use super::prefill::unix_ms;
use super::queue::PrefillQueue;
use crate::engine::{EngineError, RequestContext, TokenEngine, TokenStream};
use crate::protocols::common::PreprocessedRequest;

/// A decode worker's engine.
pub struct DisaggDecodeEngine {
    engine: Arc<dyn KvHandoff>,
    queue: PrefillQueue,
    config: DisaggConfig,
    metrics: DisaggMetrics,
}

impl std::fmt::Debug for DisaggDecodeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisaggDecodeEngine").field("queue", &self.queue).field("config", &self.config).finish()
    }
}

impl DisaggDecodeEngine {
    /// Decode with `engine`, sending prefills to `queue` by `config`'s rule.
    pub fn new(engine: Arc<dyn KvHandoff>, queue: PrefillQueue, config: DisaggConfig, metrics: DisaggMetrics) -> Self {
        DisaggDecodeEngine { engine, queue, config, metrics }
    }

    /// The counters.
    pub fn metrics(&self) -> &DisaggMetrics {
        &self.metrics
    }

    /// Decide, and run the remote prefill if chosen; where the prefill ends up.
    async fn prefill(&self, request: &PreprocessedRequest, ctx: &RequestContext) -> PrefillSource {
        if !self.queue.has_workers() {
            return PrefillSource::Local;
        }
        let tokens = &request.token_ids;
        let cached = self.engine.cached_prefix_tokens(tokens).await.unwrap_or(0);
        let queued = self.queue.size().await;
        if !self.config.prefill_remotely(tokens.len(), cached, queued) {
            return PrefillSource::Local;
        }
        let timeout = self.config.remote_prefill_timeout;
        let job = PrefillJob {
            request_id: ctx.id().to_string(),
            token_ids: tokens.clone(),
            deadline_unix_ms: unix_ms() + timeout.as_millis() as u64,
            reply_subject: None,
        };
        let remote = async {
            let started = tokio::time::Instant::now();
            let descriptor = self.queue.submit(job, timeout).await?;
            let left = timeout.saturating_sub(started.elapsed());
            tokio::time::timeout(left, self.engine.receive_kv(tokens, &descriptor))
                .await
                .map_err(|_| EngineError::Timeout(format!("receiving the KV cache took longer than {timeout:?}")))?
        };
        tokio::select! {
            // The stopped request ends in `generate`; nothing to wait for.
            _ = ctx.stopped() => PrefillSource::Local,
            result = remote => match result {
                Ok(blocks) => {
                    tracing::debug!(request = ctx.id(), blocks, "prefilled remotely");
                    PrefillSource::Remote
                }
                Err(e) => {
                    tracing::warn!(request = ctx.id(), error = %e, "remote prefill failed; prefilling locally");
                    PrefillSource::Fallback
                }
            },
        }
    }
}

#[async_trait]
impl TokenEngine for DisaggDecodeEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        if request.token_ids.is_empty() {
            return self.engine.generate(request, ctx).await;
        }
        let source = self.prefill(&request, &ctx).await;
        self.metrics.prefill(source);
        self.engine.generate(request, ctx).await
    }
}

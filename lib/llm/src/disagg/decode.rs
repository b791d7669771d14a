//! The decode role: before generating, have the prompt prefilled on a prefill worker
//! when the decision rule says so, receiving its KV; otherwise (or when the remote
//! prefill fails or times out) the engine prefills locally as usual. Every remote wait
//! is bounded by `remote_prefill_timeout`.
//!
//! [`RemotePrefill`] is that step for any engine (the Python bindings drive it from a
//! Python engine's handler); [`DisaggDecodeEngine`] wraps a [`KvHandoff`] engine with it.

use std::future::Future;
use std::sync::Arc;

use async_trait::async_trait;

use super::config::DisaggConfig;
use super::handoff::{KvHandoff, KvTransferDescriptor, PrefillJob};
use super::metrics::{DisaggMetrics, PrefillSource};
use super::prefill::unix_ms;
use super::queue::PrefillQueue;
use crate::engine::{EngineError, RequestContext, TokenEngine, TokenStream};
use crate::protocols::common::PreprocessedRequest;

/// A decode worker's side of disaggregation: the rule, the queue, the bound on the wait
/// and the counters.
pub struct RemotePrefill {
    queue: PrefillQueue,
    config: DisaggConfig,
    metrics: DisaggMetrics,
}

impl std::fmt::Debug for RemotePrefill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemotePrefill").field("queue", &self.queue).field("config", &self.config).finish()
    }
}

impl RemotePrefill {
    /// Send prefills to `queue` by `config`'s rule, counting them in `metrics`.
    pub fn new(queue: PrefillQueue, config: DisaggConfig, metrics: DisaggMetrics) -> Self {
        RemotePrefill { queue, config, metrics }
    }

    /// The counters.
    pub fn metrics(&self) -> &DisaggMetrics {
        &self.metrics
    }

    /// The queue.
    pub fn queue(&self) -> &PrefillQueue {
        &self.queue
    }

    /// Decide where the prompt `tokens` is prefilled and, if remotely, have a prefill
    /// worker compute it and `receive` its descriptor (the engine takes the KV), all
    /// within `remote_prefill_timeout`. `cached` is asked only when a prefill worker is
    /// up: the engine's cached prefix of the prompt, in tokens. Counts the outcome;
    /// returns the descriptor `receive` accepted, or `None` when the engine must
    /// prefill locally (by the rule, or after a failed remote attempt).
    pub async fn prefill<C, R, F>(
        &self,
        tokens: &[u32],
        ctx: &RequestContext,
        cached: C,
        receive: R,
    ) -> Option<KvTransferDescriptor>
    where
        C: Future<Output = usize>,
        R: FnOnce(KvTransferDescriptor) -> F,
        F: Future<Output = Result<KvTransferDescriptor, EngineError>>,
    {
        let (source, descriptor) = self.decide_and_run(tokens, ctx, cached, receive).await;
        self.metrics.prefill(source);
        descriptor
    }

    async fn decide_and_run<C, R, F>(
        &self,
        tokens: &[u32],
        ctx: &RequestContext,
        cached: C,
        receive: R,
    ) -> (PrefillSource, Option<KvTransferDescriptor>)
    where
        C: Future<Output = usize>,
        R: FnOnce(KvTransferDescriptor) -> F,
        F: Future<Output = Result<KvTransferDescriptor, EngineError>>,
    {
        if tokens.is_empty() || !self.queue.has_workers() {
            return (PrefillSource::Local, None);
        }
        let cached = cached.await;
        let queued = self.queue.size().await;
        if !self.config.prefill_remotely(tokens.len(), cached, queued) {
            return (PrefillSource::Local, None);
        }
        let timeout = self.config.remote_prefill_timeout;
        let job = PrefillJob {
            request_id: ctx.id().to_string(),
            token_ids: tokens.to_vec(),
            deadline_unix_ms: unix_ms() + timeout.as_millis() as u64,
            reply_subject: None,
        };
        let remote = async {
            let started = tokio::time::Instant::now();
            let descriptor = self.queue.submit(job, timeout).await?;
            let left = timeout.saturating_sub(started.elapsed());
            tokio::time::timeout(left, receive(descriptor))
                .await
                .map_err(|_| EngineError::Timeout(format!("receiving the KV cache took longer than {timeout:?}")))?
        };
        tokio::select! {
            // The stopped request ends in the engine's `generate`; nothing to wait for.
            _ = ctx.stopped() => (PrefillSource::Local, None),
            result = remote => match result {
                Ok(descriptor) => {
                    tracing::debug!(request = ctx.id(), blocks = descriptor.block_hashes.len(), "prefilled remotely");
                    (PrefillSource::Remote, Some(descriptor))
                }
                Err(e) => {
                    tracing::warn!(request = ctx.id(), error = %e, "remote prefill failed; prefilling locally");
                    (PrefillSource::Fallback, None)
                }
            },
        }
    }
}

/// A decode worker's engine: a [`KvHandoff`] engine behind [`RemotePrefill`].
pub struct DisaggDecodeEngine {
    engine: Arc<dyn KvHandoff>,
    remote: RemotePrefill,
}

impl std::fmt::Debug for DisaggDecodeEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DisaggDecodeEngine").field("remote", &self.remote).finish()
    }
}

impl DisaggDecodeEngine {
    /// Decode with `engine`, sending prefills to `queue` by `config`'s rule.
    pub fn new(engine: Arc<dyn KvHandoff>, queue: PrefillQueue, config: DisaggConfig, metrics: DisaggMetrics) -> Self {
        DisaggDecodeEngine { engine, remote: RemotePrefill::new(queue, config, metrics) }
    }

    /// The counters.
    pub fn metrics(&self) -> &DisaggMetrics {
        self.remote.metrics()
    }
}

#[async_trait]
impl TokenEngine for DisaggDecodeEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        if request.token_ids.is_empty() {
            return self.engine.generate(request, ctx).await;
        }
        let tokens = &request.token_ids;
        let engine = &self.engine;
        let cached = async { engine.cached_prefix_tokens(tokens).await.unwrap_or(0) };
        let receive = |descriptor: KvTransferDescriptor| async move {
            engine.receive_kv(tokens, &descriptor).await.map(|_| descriptor)
        };
        self.remote.prefill(tokens, &ctx, cached, receive).await;
        self.engine.generate(request, ctx).await
    }
}

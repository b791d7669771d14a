//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`]. The token engine
//! may route with a [`KvRouter`] instead of the client's modes, and continues a stream
//! broken mid-way on another worker (see [`super::migration`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use dynamo_runtime::{Client, ErrorKind};

use super::linked_stream::LinkedStream;
use super::migration::{send_resending, Attempt, MigrationPolicy, Resender, SendError, StreamFailure, WorkerStream};
use super::router_mode::RouterMode;
use super::wire::{decode_error, decode_openai_item};
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, OpenAIStream, RequestContext, TokenEngine, TokenStream,
};
use crate::kv_router::{GuardedStream, KvRouter, KvDecision, ScheduleError};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest, FinishingChunk};

/// Send `request` as JSON with the runtime's `mode`; the runtime's error as is.
async fn send_with(
    client: &Client,
    mode: dynamo_runtime::RouterMode,
    request: &impl Serialize,
    ctx: &RequestContext,
) -> Result<LinkedStream, dynamo_runtime::Error> {
    let body = serde_json::to_vec(request).map_err(|e| {
        dynamo_runtime::Error::new(ErrorKind::Serialization, format!("cannot serialize the request: {e}"))
    })?;
    let stream = client.send(mode, Bytes::from(body), Some(ctx.id().to_string())).await?;
    Ok(LinkedStream::new(stream, ctx))
}

/// The worker's items decoded as engine outputs; annotation-only items are skipped.
fn worker_items(stream: LinkedStream) -> WorkerStream {
    stream
        .filter_map(|item| async move {
            match item {
                Ok(item) if item.body.is_empty() => None,
                Ok(item) => Some(serde_json::from_slice::<LLMEngineOutput>(&item.body).map_err(|e| {
                    StreamFailure::Decode(EngineError::Internal(format!(
                        "the worker sent an item that is not an LLMEngineOutput: {e}"
                    )))
                })),
                Err(e) => Some(Err(StreamFailure::Runtime(e))),
            }
        })
        .boxed()
}

/// The worker's items decoded as OpenAI chunks; annotation-only items are skipped. A
/// stream that ends before any chunk carried a finish reason (unless the caller stopped
/// it) ends with an error, so a truncated response never looks complete.
fn openai_items<T>(stream: LinkedStream, ctx: &RequestContext) -> OpenAIStream<T>
where
    T: DeserializeOwned + FinishingChunk + Send + 'static,
{
    struct State {
        stream: LinkedStream,
        ctx: RequestContext,
        finished: bool,
        done: bool,
    }
    let state = State { stream, ctx: ctx.clone(), finished: false, done: false };
    futures::stream::unfold(state, |mut st| async move {
        while !st.done {
            let item = match st.stream.next().await {
                Some(Ok(item)) if item.body.is_empty() => continue,
                Some(Ok(item)) => decode_openai_item::<T>(&item.body),
                Some(Err(e)) => Err(decode_error(e)),
                None if st.finished || st.ctx.is_stopped() => return None,
                None => Err(EngineError::Internal(
                    "the worker's stream ended without a finish reason; the response is incomplete".to_string(),
                )),
            };
            match &item {
                Ok(chunk) => st.finished |= chunk.data.finishes(),
                Err(_) => st.done = true,
            }
            return Some((item, st));
        }
        None
    })
    .boxed()
}

/// An OpenAI engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteOpenAIEngine {
    client: Client,
    mode: RouterMode,
}

impl RemoteOpenAIEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode`.
    pub fn new(client: Client, mode: RouterMode) -> Self {
        RemoteOpenAIEngine { client, mode }
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.client
    }

    async fn send(&self, request: &impl Serialize, ctx: &RequestContext) -> Result<LinkedStream, EngineError> {
        send_with(&self.client, self.mode.to_runtime(), request, ctx).await.map_err(decode_error)
    }
}

#[async_trait]
impl OpenAIEngine for RemoteOpenAIEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        Ok(openai_items(self.send(&request, &ctx).await?, &ctx))
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        Ok(openai_items(self.send(&request, &ctx).await?, &ctx))
    }
}

/// A token engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteTokenEngine {
    inner: Arc<Sender>,
    migration: MigrationPolicy,
}

/// What sends one attempt of a token request; shared by the engine and the
/// migrating streams it returns.
#[derive(Debug)]
struct Sender {
    client: Client,
    mode: RouterMode,
    kv: Option<Arc<KvRouter>>,
    /// The one instance every request goes to, when pinned.
    pinned: Option<u64>,
    /// Round-robin position among the candidate instances.
    next: AtomicUsize,
}

impl RemoteTokenEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode` (`Kv` here is
    /// round-robin: use [`Self::with_kv_router`]).
    pub fn new(client: Client, mode: RouterMode) -> Self {
        Self::build(client, mode, None, None)
    }

    /// Forward to the instances of `client`'s endpoint that `router` picks.
    pub fn with_kv_router(client: Client, router: Arc<KvRouter>) -> Self {
        Self::build(client, RouterMode::Kv, Some(router), None)
    }

    /// Send every request to `instance` of `client`'s endpoint (a caller that picked the
    /// worker itself, like a processor asking a router service); an instance that is
    /// gone is an error, not a reroute.
    pub fn to_instance(client: Client, instance: u64) -> Self {
        Self::build(client, RouterMode::RoundRobin, None, Some(instance))
    }

    fn build(client: Client, mode: RouterMode, kv: Option<Arc<KvRouter>>, pinned: Option<u64>) -> Self {
        let next = AtomicUsize::new(rand::random::<u32>() as usize);
        let inner = Arc::new(Sender { client, mode, kv, pinned, next });
        RemoteTokenEngine { inner, migration: MigrationPolicy::default() }
    }

    /// Resend requests no worker started and continue streams broken mid-way within the
    /// bounds of `policy` (see [`super::migration`]).
    pub fn with_migration(mut self, policy: MigrationPolicy) -> Self {
        self.migration = policy;
        self
    }

    /// The KV router, when it routes with one.
    pub fn kv_router(&self) -> Option<&Arc<KvRouter>> {
        self.inner.kv.as_ref()
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }
}

impl Sender {
    /// The instance for `request`: the pinned one, else among the routable instances not
    /// in `avoid` (all routable ones when none is left), the one the KV router or the
    /// mode picks. The KV decision is returned so that the stream counts in flight on
    /// its worker.
    fn pick(&self, request: &mut PreprocessedRequest, avoid: &[u64]) -> Result<(u64, Option<KvDecision>), SendError> {
        if let Some(instance) = self.pinned {
            return Ok((instance, None));
        }
        // Instances found dead (ping timeout, refused, not taking requests) are left out
        // until they answer again.
        let live: Vec<u64> = self.client.routable_instance_ids();
        let candidates: Vec<u64> = live.iter().copied().filter(|id| !avoid.contains(id)).collect();
        let candidates = if candidates.is_empty() { live } else { candidates };
        if candidates.is_empty() {
            let registered = self.client.instance_ids().len();
            let message = match registered {
                0 => format!("no instances of {} are registered", self.client.endpoint()),
                n => format!("all {n} registered instances of {} are unreachable or not answering", self.client.endpoint()),
            };
            return Err(SendError::Failed(EngineError::Unavailable(message)));
        }
        if let Some(router) = &self.kv {
            match router.route(&request.token_ids, &candidates) {
                Ok(decision) => {
                    request.estimated_prefix_hit_num_blocks = Some(u32::try_from(decision.overlap_blocks).unwrap_or(u32::MAX));
                    return Ok((decision.worker, Some(decision)));
                }
                Err(e @ ScheduleError::AllBusy { .. }) => return Err(SendError::Failed(EngineError::Unavailable(e.to_string()))),
                // Not in the router's index yet: round-robin below.
                Err(ScheduleError::NoWorkers) => request.estimated_prefix_hit_num_blocks = None,
            }
        }
        let index = match self.mode {
            RouterMode::Random => rand::random::<u32>() as usize,
            RouterMode::RoundRobin | RouterMode::Kv => self.next.fetch_add(1, Ordering::Relaxed),
        };
        Ok((candidates[index % candidates.len()], None))
    }

    /// Send one attempt direct to the instance [`Self::pick`] chooses; every resend is
    /// decided by [`super::migration`]. A KV-routed stream counts as in flight on its
    /// worker until it ends or is dropped; a KV-routed instance that is gone is dropped
    /// from the router's index.
    async fn send(&self, mut request: PreprocessedRequest, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt, SendError> {
        let (instance, decision) = self.pick(&mut request, avoid)?;
        tracing::debug!(request = ctx.id(), instance = %format_args!("{instance:x}"), "sending to instance");
        let direct = dynamo_runtime::RouterMode::Direct(instance);
        match send_with(&self.client, direct, &request, ctx).await {
            Ok(stream) => {
                let stream = worker_items(stream);
                let stream = match (&self.kv, &decision) {
                    (Some(router), Some(decision)) => GuardedStream::new(stream, router.start_decision(decision)).boxed(),
                    _ => stream,
                };
                Ok(Attempt { stream, instance })
            }
            Err(e) if self.pinned.is_none() && is_unreachable(e.kind()) => {
                if let (Some(router), true) = (&self.kv, is_gone(e.kind())) {
                    router.remove_worker(instance);
                }
                Err(SendError::Unreachable { instance, error: e })
            }
            Err(e) => Err(SendError::Failed(decode_error(e))),
        }
    }
}

/// A send failed because of the instance or the path to it: another instance may take
/// the request.
fn is_unreachable(kind: ErrorKind) -> bool {
    is_gone(kind) || matches!(kind, ErrorKind::Disconnected | ErrorKind::Timeout)
}

/// The instance is not (or no longer) there to take requests.
fn is_gone(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::NoInstances | ErrorKind::InstanceNotFound | ErrorKind::Unavailable)
}

#[async_trait]
impl Resender for Arc<Sender> {
    async fn send(&self, request: PreprocessedRequest, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt, SendError> {
        Sender::send(self, request, ctx, avoid).await
    }

    fn set_aside(&self, instance: u64, kind: ErrorKind) {
        if self.pinned.is_some() {
            return;
        }
        match kind {
            ErrorKind::Timeout => self.client.mark_unresponsive(instance),
            _ => self.client.mark_down(instance),
        }
    }
}

#[async_trait]
impl TokenEngine for RemoteTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        send_resending(self.inner.clone(), request, ctx, self.migration.clone()).await
    }
}

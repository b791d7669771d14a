//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`]. The token engine
//! picks each attempt's instance with a [`crate::routing`] selector (round-robin,
//! random, one pinned instance, or the [`KvRouter`]) and sends direct to it; whether a
//! failed attempt is resent, and where, is decided in [`super::migration`]. The OpenAI
//! engine still uses the runtime client's modes and retry.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use dynamo_runtime::{Client, ErrorKind};

use super::linked_stream::LinkedStream;
use super::migration::{send_resending, Attempt, MigrationPolicy, Resender, SendError, StreamFailure, WorkerStream};
use super::wire::{decode_error, decode_openai_item};
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, OpenAIStream, RequestContext, TokenEngine, TokenStream,
};
use crate::kv_router::{GuardedStream, KvRouter};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest, FinishingChunk};
use crate::routing::{self, Direct, KvSelector, Pick, RouterMode, Selector};

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
    selector: Arc<dyn Selector>,
    /// The KV router the selector routes with, when it does.
    kv: Option<Arc<KvRouter>>,
    /// Every request goes to one instance the caller chose: nothing is resent or set aside.
    pinned: bool,
}

impl RemoteTokenEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode` (`Kv` here is
    /// round-robin: use [`Self::with_kv_router`]).
    pub fn new(client: Client, mode: RouterMode) -> Self {
        Self::build(client, routing::selector(mode, None), None, false)
    }

    /// Forward to the instances of `client`'s endpoint that `router` picks.
    pub fn with_kv_router(client: Client, router: Arc<KvRouter>) -> Self {
        Self::build(client, Arc::new(KvSelector::new(router.clone())), Some(router), false)
    }

    /// Send every request to `instance` of `client`'s endpoint (a caller that picked the
    /// worker itself, like a processor asking a router service); an instance that is
    /// gone is an error, not a reroute.
    pub fn to_instance(client: Client, instance: u64) -> Self {
        Self::build(client, Arc::new(Direct::new(instance)), None, true)
    }

    fn build(client: Client, selector: Arc<dyn Selector>, kv: Option<Arc<KvRouter>>, pinned: bool) -> Self {
        let inner = Arc::new(Sender { client, selector, kv, pinned });
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
    /// The selector's pick for `request` among the routable instances not in `avoid`
    /// (all routable ones when none is left); a pinned sender's instance whatever they are.
    fn pick(&self, request: &mut PreprocessedRequest, avoid: &[u64]) -> Result<Pick, SendError> {
        let mut candidates = Vec::new();
        if !self.pinned {
            // Instances found dead (ping timeout, refused, not taking requests) are left
            // out until they answer again.
            let live: Vec<u64> = self.client.routable_instance_ids();
            candidates = live.iter().copied().filter(|id| !avoid.contains(id)).collect();
            if candidates.is_empty() {
                candidates = live;
            }
            if candidates.is_empty() {
                let message = match self.client.instance_ids().len() {
                    0 => format!("no instances of {} are registered", self.client.endpoint()),
                    n => format!("all {n} registered instances of {} are unreachable or not answering", self.client.endpoint()),
                };
                return Err(SendError::Failed(EngineError::Unavailable(message)));
            }
        }
        let pick = self.selector.select(&request.token_ids, &candidates).map_err(|e| SendError::Failed(EngineError::Unavailable(e.to_string())))?;
        if self.kv.is_some() {
            request.estimated_prefix_hit_num_blocks = pick.overlap_blocks.map(|b| u32::try_from(b).unwrap_or(u32::MAX));
        }
        Ok(pick)
    }

    /// Send one attempt direct to the instance [`Self::pick`] chooses; every resend is
    /// decided by [`super::migration`]. The pick's load (a KV-routed stream in flight on
    /// its worker) is held until the stream ends or is dropped; an instance that is gone
    /// is reported to the selector (the KV router drops it from its index).
    async fn send(&self, mut request: PreprocessedRequest, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt, SendError> {
        let pick = self.pick(&mut request, avoid)?;
        let instance = pick.instance;
        tracing::debug!(request = ctx.id(), instance = %format_args!("{instance:x}"), "sending to instance");
        let direct = dynamo_runtime::RouterMode::Direct(instance);
        match send_with(&self.client, direct, &request, ctx).await {
            Ok(stream) => {
                let stream = match pick.load {
                    Some(load) => GuardedStream::new(worker_items(stream), load).boxed(),
                    None => worker_items(stream),
                };
                Ok(Attempt { stream, instance })
            }
            Err(e) if !self.pinned && is_unreachable(e.kind()) => {
                if is_gone(e.kind()) {
                    self.selector.on_end_unreachable(instance);
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
    is_gone(kind) || matches!(kind, ErrorKind::Disconnected | ErrorKind::Timeout | ErrorKind::NotTaken)
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

    fn set_aside(&self, instance: u64, error: &dynamo_runtime::Error) {
        if self.pinned {
            return;
        }
        if error.kind() == ErrorKind::NotTaken {
            // It did not take the request at all: out of routing until it answers a ping.
            self.client.mark_unresponsive(instance);
        } else if error.kind() != ErrorKind::Timeout {
            // Refused, or its stream broke: skipped for a moment (discovery removes a
            // dying instance soon).
            self.client.mark_down(instance);
        }
        // A stream bound (first-item or item timeout) is a slow handler on a live
        // worker: this request avoids it, new requests still go to it.
    }
}

#[async_trait]
impl TokenEngine for RemoteTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        send_resending(self.inner.clone(), request, ctx, self.migration.clone()).await
    }
}

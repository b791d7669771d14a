//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`]. Both pick each
//! attempt's instance with a [`crate::routing`] selector (round-robin, random, one
//! pinned instance, or the [`KvRouter`] for token requests) and send direct to it;
//! whether a failed attempt is resent, and where, is decided in [`super::migration`]
//! (an OpenAI-level request only before its first chunk).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use dynamo_runtime::{Client, ErrorKind};

use super::linked_stream::LinkedStream;
use super::migration::{
    send_resending, Attempt, MigrationPolicy, OpenAIRequest, Resender, SendError, StreamFailure, WorkerStream,
};
use super::wire::{decode_error, decode_openai_item};
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, OpenAIStream, RequestContext, StreamItem, TokenEngine,
    TokenStream,
};
use crate::kv_router::KvRouter;
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse, FinishingChunk};
use crate::routing::{self, Direct, KvSelector, Outcome, Pick, RouterMode, Selector, TrackedStream};

/// The worker's items decoded as engine outputs; annotation-only items are skipped.
fn worker_items(stream: LinkedStream) -> WorkerStream<LLMEngineOutput> {
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

/// The worker's items decoded as OpenAI chunks; annotation-only items are skipped.
fn openai_worker_items<T: DeserializeOwned + Send + 'static>(stream: LinkedStream) -> WorkerStream<StreamItem<T>> {
    stream
        .filter_map(|item| async move {
            match item {
                Ok(item) if item.body.is_empty() => None,
                Ok(item) => Some(decode_openai_item::<T>(&item.body).map_err(StreamFailure::Decode)),
                Err(e) => Some(Err(StreamFailure::Runtime(e))),
            }
        })
        .boxed()
}

/// `stream`, ending with an error when it ends before any chunk carried a finish reason
/// (unless the caller stopped it), so a truncated response never looks complete.
fn truthful_end<T>(stream: OpenAIStream<T>, ctx: &RequestContext) -> OpenAIStream<T>
where
    T: FinishingChunk + Send + 'static,
{
    struct State<T> {
        stream: OpenAIStream<T>,
        ctx: RequestContext,
        finished: bool,
        done: bool,
    }
    let state = State { stream, ctx: ctx.clone(), finished: false, done: false };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        let item = match st.stream.next().await {
            Some(item) => item,
            None if st.finished || st.ctx.is_stopped() => return None,
            None => Err(EngineError::Internal(
                "the worker's stream ended without a finish reason; the response is incomplete".to_string(),
            )),
        };
        match &item {
            Ok(chunk) => st.finished |= chunk.data.finishes(),
            Err(_) => st.done = true,
        }
        Some((item, st))
    })
    .boxed()
}

/// An OpenAI engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteOpenAIEngine {
    inner: Arc<Sender>,
    migration: MigrationPolicy,
}

impl RemoteOpenAIEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode` (`Kv` is
    /// round-robin here: an OpenAI request has no token ids at the frontend).
    pub fn new(client: Client, mode: RouterMode) -> Self {
        let inner = Arc::new(Sender { client, selector: routing::selector(mode, None), kv: None, pinned: false });
        RemoteOpenAIEngine { inner, migration: MigrationPolicy::default() }
    }

    /// Resend requests no worker started within `policy.resend_limit` (a started
    /// OpenAI-level stream is never continued elsewhere, whatever `policy.limit` says).
    pub fn with_migration(mut self, policy: MigrationPolicy) -> Self {
        self.migration = policy;
        self
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    async fn send<Q, T>(&self, request: Q, ctx: RequestContext) -> Result<OpenAIStream<T>, EngineError>
    where
        Q: Serialize + Clone + Send + Sync + 'static,
        T: DeserializeOwned + FinishingChunk + Send + 'static,
    {
        let request = OpenAIRequest::<Q, T>::new(request);
        let stream = send_resending(self.inner.clone(), request, ctx.clone(), self.migration.clone()).await?;
        Ok(truthful_end(stream, &ctx))
    }
}

#[async_trait]
impl OpenAIEngine for RemoteOpenAIEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        self.send::<_, ChatCompletionChunk>(request, ctx).await
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        self.send::<_, CompletionResponse>(request, ctx).await
    }
}

/// A token engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteTokenEngine {
    inner: Arc<Sender>,
    migration: MigrationPolicy,
}

/// What sends one attempt of a request (token-level or OpenAI-level); shared by an
/// engine and the migrating streams it returns.
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
    /// The selector's pick for a request of prompt `tokens` among the routable instances
    /// not in `avoid` (all routable ones when none is left); a pinned sender's instance
    /// whatever they are.
    fn pick(&self, tokens: &[u32], avoid: &[u64]) -> Result<Pick, SendError> {
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
        if avoid.is_empty() {
            // A request's first pick is its last admission check: its TTFT target against
            // the selector's estimate (an admitted request's resends are not refused).
            crate::admission::check_ttft_target(|| self.selector.ttft_estimate(tokens, &candidates))
                .map_err(SendError::Failed)?;
        }
        self.selector.select(tokens, &candidates).map_err(|e| SendError::Failed(EngineError::Unavailable(e.to_string())))
    }

    /// Send one attempt of `request` direct to the instance of `pick`, its items decoded
    /// by `items`; every resend is decided by [`super::migration`]. The selector hears
    /// how the attempt ended ([`Selector::on_end`]): at the stream's end, error or drop
    /// ([`TrackedStream`]), or at once when it could not be sent (`Gone` for an instance
    /// that is not there: the KV router drops it from its index).
    async fn send_direct<O: Send + 'static>(
        &self,
        pick: Pick,
        request: &impl Serialize,
        ctx: &RequestContext,
        items: fn(LinkedStream) -> WorkerStream<O>,
    ) -> Result<Attempt<O>, SendError> {
        let instance = pick.instance;
        tracing::debug!(request = ctx.id(), instance = %format_args!("{instance:x}"), "sending to instance");
        let body = match serde_json::to_vec(request) {
            Ok(body) => body,
            Err(e) => {
                self.selector.on_end(pick, Outcome::Failed);
                return Err(SendError::Failed(EngineError::Internal(format!("cannot serialize the request: {e}"))));
            }
        };
        let direct = dynamo_runtime::RouterMode::Direct(instance);
        match self.client.send(direct, Bytes::from(body), Some(ctx.id().to_string())).await {
            Ok(stream) => {
                let stream = items(LinkedStream::new(stream, ctx));
                let stream = TrackedStream::new(stream, self.selector.clone(), pick).boxed();
                Ok(Attempt { stream, instance })
            }
            Err(e) if !self.pinned && is_unreachable(e.kind()) => {
                let outcome = if is_gone(e.kind()) { Outcome::Gone } else { Outcome::Failed };
                self.selector.on_end(pick, outcome);
                Err(SendError::Unreachable { instance, error: e })
            }
            Err(e) => {
                self.selector.on_end(pick, Outcome::Failed);
                Err(SendError::Failed(decode_error(e)))
            }
        }
    }

    /// `instance` failed a request with `error`: see [`Resender::set_aside`].
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
impl Resender<PreprocessedRequest> for Arc<Sender> {
    async fn send(
        &self,
        mut request: PreprocessedRequest,
        ctx: &RequestContext,
        avoid: &[u64],
    ) -> Result<Attempt<LLMEngineOutput>, SendError> {
        let pick = self.pick(&request.token_ids, avoid)?;
        if self.kv.is_some() {
            request.estimated_prefix_hit_num_blocks = pick.overlap_blocks.map(|b| u32::try_from(b).unwrap_or(u32::MAX));
        }
        self.send_direct(pick, &request, ctx, worker_items).await
    }

    fn set_aside(&self, instance: u64, error: &dynamo_runtime::Error) {
        Sender::set_aside(self, instance, error)
    }
}

#[async_trait]
impl<Q, T> Resender<OpenAIRequest<Q, T>> for Arc<Sender>
where
    Q: Serialize + Clone + Send + Sync + 'static,
    T: DeserializeOwned + FinishingChunk + Send + 'static,
{
    async fn send(
        &self,
        request: OpenAIRequest<Q, T>,
        ctx: &RequestContext,
        avoid: &[u64],
    ) -> Result<Attempt<StreamItem<T>>, SendError> {
        let pick = self.pick(&[], avoid)?;
        self.send_direct(pick, &request.body, ctx, openai_worker_items::<T>).await
    }

    fn set_aside(&self, instance: u64, error: &dynamo_runtime::Error) {
        Sender::set_aside(self, instance, error)
    }
}

#[async_trait]
impl TokenEngine for RemoteTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        send_resending(self.inner.clone(), request, ctx, self.migration.clone()).await
    }
}

//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`]. Both pick each
//! attempt's instance with a [`crate::routing`] selector (round-robin, random, one
//! pinned instance, or the [`KvRouter`] for token requests) and send direct to it;
//! whether a failed attempt is resent, and where, is decided in [`super::migration`]
//! (an OpenAI-level request only before its first chunk).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use prometheus::IntGauge;
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
use crate::model_manager::Waiting;
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse, FinishingChunk};
use crate::routing::{self, Direct, KvSelector, Outcome, Pick, RouterMode, SelectError, Selector, TrackedStream};

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
        let inner = Arc::new(Sender::new(client, routing::selector(mode, None), None, false, None));
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
    /// Requests held now because every worker is busy (the KV router's `busy_wait`),
    /// and the gauge that shows them.
    holding: AtomicUsize,
    held_gauge: Option<IntGauge>,
    /// The order of held requests: the first held picks first.
    line: tokio::sync::Mutex<()>,
}

/// How often a held request's turn looks again for a worker under the busy threshold:
/// the router's view moves as requests end and load reports arrive.
const HOLD_POLL: Duration = Duration::from_millis(10);

/// What a pick found.
enum Picked {
    Pick(Pick),
    /// Every candidate is over the busy threshold (the router's message).
    Busy(String),
}

/// One request counted as held while it lives (and in the held gauge, when there is one).
struct Held<'a> {
    count: &'a AtomicUsize,
    _shown: Option<Waiting>,
}

impl<'a> Held<'a> {
    fn new(count: &'a AtomicUsize, gauge: Option<&IntGauge>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Held { count, _shown: gauge.map(|g| Waiting::new(g.clone())) }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
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
        let inner = Arc::new(Sender::new(client, selector, kv, pinned, None));
        RemoteTokenEngine { inner, migration: MigrationPolicy::default() }
    }

    /// Show the requests held while every worker is busy (the KV router's `busy_wait`)
    /// on `gauge`.
    pub fn with_held_gauge(self, gauge: IntGauge) -> Self {
        let s = &self.inner;
        let inner = Arc::new(Sender::new(s.client.clone(), s.selector.clone(), s.kv.clone(), s.pinned, Some(gauge)));
        RemoteTokenEngine { inner, migration: self.migration }
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
    fn new(client: Client, selector: Arc<dyn Selector>, kv: Option<Arc<KvRouter>>, pinned: bool, held_gauge: Option<IntGauge>) -> Self {
        Sender { client, selector, kv, pinned, holding: AtomicUsize::new(0), held_gauge, line: tokio::sync::Mutex::new(()) }
    }

    /// The routable instances not in `avoid` (all routable ones when none is left).
    fn candidates(&self, avoid: &[u64]) -> Result<Vec<u64>, SendError> {
        // Instances found dead (ping timeout, refused, not taking requests) are left
        // out until they answer again.
        let live: Vec<u64> = self.client.routable_instance_ids();
        let mut candidates: Vec<u64> = live.iter().copied().filter(|id| !avoid.contains(id)).collect();
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
        Ok(candidates)
    }

    /// The request's TTFT target against the selector's estimate among `candidates`.
    fn admit(&self, tokens: &[u32], candidates: &[u64]) -> Result<(), SendError> {
        crate::admission::check_ttft_target(|| self.selector.ttft_estimate(tokens, candidates)).map_err(SendError::Failed)
    }

    /// The selector's pick for a request of prompt `tokens` among `candidates` (a
    /// pinned sender's instance whatever they are); `admit`: check the request's TTFT
    /// target first (a request's first pick is its last admission check; an admitted
    /// request's resends, or a held request's later looks, are not refused).
    fn try_pick(&self, tokens: &[u32], avoid: &[u64], admit: bool) -> Result<Picked, SendError> {
        let candidates = if self.pinned { Vec::new() } else { self.candidates(avoid)? };
        if admit && avoid.is_empty() {
            self.admit(tokens, &candidates)?;
        }
        match self.selector.select(tokens, &candidates) {
            Ok(pick) => Ok(Picked::Pick(pick)),
            Err(SelectError::AllBusy(message)) => Ok(Picked::Busy(message)),
            Err(e) => Err(SendError::Failed(EngineError::Unavailable(e.to_string()))),
        }
    }

    /// The instance for a request of prompt `tokens`, not one of `avoid` while another
    /// is routable. When every worker is over the KV router's busy threshold the request
    /// is refused (503), or, with the router's `busy_wait`, held: first come, first
    /// served (a newcomer queues behind the requests already held), until a worker is
    /// under the threshold again or a new one joins, the bound passes (503) or the
    /// request is stopped.
    async fn pick(&self, tokens: &[u32], avoid: &[u64], ctx: &RequestContext) -> Result<Pick, SendError> {
        let Some(bound) = self.kv.as_ref().and_then(|kv| kv.config().scheduler.busy_wait) else {
            return match self.try_pick(tokens, avoid, true)? {
                Picked::Pick(pick) => Ok(pick),
                Picked::Busy(why) => Err(SendError::Failed(EngineError::Unavailable(why))),
            };
        };
        if self.holding.load(Ordering::Acquire) == 0 {
            if let Picked::Pick(pick) = self.try_pick(tokens, avoid, true)? {
                return Ok(pick);
            }
        } else {
            // Others are held: this request's turn comes after theirs, admitted first.
            let candidates = self.candidates(avoid)?;
            if avoid.is_empty() {
                self.admit(tokens, &candidates)?;
            }
        }
        self.hold(bound, tokens, avoid, ctx).await
    }

    /// Hold a request while every worker is busy, up to `bound` (see [`Self::pick`]).
    async fn hold(&self, bound: Duration, tokens: &[u32], avoid: &[u64], ctx: &RequestContext) -> Result<Pick, SendError> {
        let _held = Held::new(&self.holding, self.held_gauge.as_ref());
        let deadline = tokio::time::Instant::now() + bound;
        let refused = |why: &str| {
            SendError::Failed(EngineError::Unavailable(format!(
                "{why}; the request waited {bound:?} at the frontend for one to fall under the busy threshold"
            )))
        };
        let stopped =
            || SendError::Failed(EngineError::Unavailable("the request was stopped while every worker was busy".into()));
        let _turn = tokio::select! {
            turn = tokio::time::timeout_at(deadline, self.line.lock()) => match turn {
                Ok(turn) => turn,
                Err(_) => return Err(refused("every worker is busy")),
            },
            _ = ctx.stopped() => return Err(stopped()),
        };
        loop {
            match self.try_pick(tokens, avoid, false)? {
                Picked::Pick(pick) => return Ok(pick),
                Picked::Busy(why) if tokio::time::Instant::now() >= deadline => return Err(refused(&why)),
                Picked::Busy(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep_until((tokio::time::Instant::now() + HOLD_POLL).min(deadline)) => {}
                _ = ctx.stopped() => return Err(stopped()),
            }
        }
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
        let pick = self.pick(&request.token_ids, avoid, ctx).await?;
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
        let pick = self.pick(&[], avoid, ctx).await?;
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

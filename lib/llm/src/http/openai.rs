//! `POST /v1/chat/completions` and `POST /v1/completions`: read (bounded in size and
//! time), parse and validate the body, find the model's engine, call it with a fresh
//! request context (`n` times for `n` choices), and answer with SSE (`stream: true`)
//! or one folded response. `POST /v1/embeddings` has no engine kind: its model is
//! never found.

use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::admission::{refusal_response, InflightSlot};
use crate::admission::{ticketed, with_ticket, Ticket};
use super::connections::overloaded;
use super::error::ApiError;
use super::guard::CancelOnDrop;
use super::layers::{EngineLogged, RequestId};
use super::request::{parse_json, read_body};
use super::state::AppState;
use super::sse::{sse_bodies, sse_response, ChunkMeta, SseOptions, StreamChunk};
use crate::aggregate::{ChatAggregator, CompletionAggregator};
use crate::engine::{EngineError, OpenAIStream, RequestContext, StreamItem};
use crate::model_manager::EngineKind;
use crate::protocols::openai::{
    ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse, StreamOptions,
};

/// Folds a route's chunks into its whole response.
trait Fold<C> {
    type Output: Serialize;
    fn push(&mut self, item: StreamItem<C>);
    fn finish(self) -> Self::Output;
}

impl Fold<ChatCompletionChunk> for ChatAggregator {
    type Output = crate::protocols::openai::ChatCompletionResponse;
    fn push(&mut self, item: StreamItem<ChatCompletionChunk>) {
        ChatAggregator::push(self, item)
    }
    fn finish(self) -> Self::Output {
        ChatAggregator::finish(self)
    }
}

impl Fold<CompletionResponse> for CompletionAggregator {
    type Output = CompletionResponse;
    fn push(&mut self, item: StreamItem<CompletionResponse>) {
        CompletionAggregator::push(self, item)
    }
    fn finish(self) -> Self::Output {
        CompletionAggregator::finish(self)
    }
}

/// What the handler knows about a request once it is parsed.
struct Plan {
    request_id: String,
    model: String,
    route: EngineKind,
    streaming: bool,
    include_usage: bool,
    /// Detach the stream into the registry (`X-Dynamo-Resumable: true`).
    resumable: bool,
    ctx: RequestContext,
    /// The request's admission share, held by its engine stream until its generation ends.
    ticket: Arc<Ticket>,
    /// Its slot under the global cap, held the same way.
    slot: Option<InflightSlot>,
}

/// Read and parse a request body of type `T`.
async fn read_request<T: DeserializeOwned>(state: &AppState, body: Body) -> Result<T, ApiError> {
    let bytes = read_body(body, state.body_limit, state.limits.body_timeout).await?;
    parse_json(&bytes)
}

/// A context per choice: the first is the request's own; the others follow it (a stop
/// or kill of the request reaches every choice).
fn choice_contexts(ctx: &RequestContext, n: u32) -> Vec<RequestContext> {
    let mut contexts = vec![ctx.clone()];
    for i in 1..n {
        let child = RequestContext::new(format!("{}.{i}", ctx.id()));
        let follower = child.clone();
        ctx.on_change(move |state| match state {
            dynamo_runtime::StreamState::Stopped => follower.stop_generating(),
            dynamo_runtime::StreamState::Killed => follower.kill(),
            dynamo_runtime::StreamState::Live => {}
        });
        contexts.push(child);
    }
    contexts
}

/// The seed of choice `index` of a seeded request with `n` > 1: `seed + index`, so the
/// choices differ yet repeat, as vLLM seeds its parallel samples.
fn choice_seed(seed: Option<i64>, index: usize) -> Option<i64> {
    seed.map(|s| s.wrapping_add(i64::try_from(index).unwrap_or(i64::MAX)))
}

fn include_usage(options: &Option<StreamOptions>) -> bool {
    options.as_ref().is_some_and(|o| o.include_usage)
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    slot: Option<Extension<InflightSlot>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut request: ChatCompletionRequest = match read_request(&state, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(message) = request.validate() {
        return ApiError::bad_request(message).into_response();
    }
    if request.max_tokens().is_none() {
        request.max_tokens = Some(state.limits.default_max_tokens);
    }
    let engine = match state.manager.chat_engine(&request.model) {
        Ok(e) => e,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let ticket = match state.admission.admit(&request.model) {
        Ok(t) => t,
        Err(refusal) => return refusal_response(refusal, state.manager.is_routable(&request.model)),
    };
    let plan =
        Plan::new(id, &request.model, EngineKind::Chat, request.stream, include_usage(&request.stream_options), ticket)
            .resumable(&headers)
            .holding(slot);
    let fold = ChatAggregator::new(&format!("chatcmpl-{}", plan.ctx.id()), &plan.model);
    let n = request.sampling.n.unwrap_or(1);
    if n == 1 {
        let ctx = plan.ctx.clone();
        return respond(state, plan, async move { engine.chat(request, ctx).await }, fold).await;
    }
    let contexts = choice_contexts(&plan.ctx, n);
    let id = format!("chatcmpl-{}", plan.ctx.id());
    let call = async move {
        let calls = contexts.into_iter().enumerate().map(|(i, ctx)| {
            let mut choice = request.clone();
            choice.sampling.seed = choice_seed(request.sampling.seed, i);
            engine.chat(choice, ctx)
        });
        let streams = futures::future::try_join_all(calls).await?;
        Ok(super::choices::merge(streams, id))
    };
    respond(state, plan, call, fold).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    slot: Option<Extension<InflightSlot>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let mut request: CompletionRequest = match read_request(&state, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(message) = request.validate() {
        return ApiError::bad_request(message).into_response();
    }
    if request.max_tokens.is_none() {
        request.max_tokens = Some(state.limits.default_max_tokens);
    }
    let engine = match state.manager.completions_engine(&request.model) {
        Ok(e) => e,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let ticket = match state.admission.admit(&request.model) {
        Ok(t) => t,
        Err(refusal) => return refusal_response(refusal, state.manager.is_routable(&request.model)),
    };
    let plan = Plan::new(
        id,
        &request.model,
        EngineKind::Completions,
        request.stream,
        include_usage(&request.stream_options),
        ticket,
    )
    .resumable(&headers)
    .holding(slot);
    let fold = CompletionAggregator::new(&format!("cmpl-{}", plan.ctx.id()), &plan.model);
    let n = request.sampling.n.unwrap_or(1);
    if n == 1 {
        let ctx = plan.ctx.clone();
        return respond(state, plan, async move { engine.completion(request, ctx).await }, fold).await;
    }
    let contexts = choice_contexts(&plan.ctx, n);
    let id = format!("cmpl-{}", plan.ctx.id());
    let call = async move {
        let calls = contexts.into_iter().enumerate().map(|(i, ctx)| {
            let mut choice = request.clone();
            choice.sampling.seed = choice_seed(request.sampling.seed, i);
            engine.completion(choice, ctx)
        });
        let streams = futures::future::try_join_all(calls).await?;
        Ok(super::choices::merge(streams, id))
    };
    respond(state, plan, call, fold).await
}

/// `POST /v1/embeddings`: no engine serves embeddings, so the body is checked and the
/// model is not found (404, OpenAI-shaped).
pub(crate) async fn embeddings(State(state): State<Arc<AppState>>, body: Body) -> Response {
    #[derive(serde::Deserialize)]
    #[allow(dead_code)]
    struct EmbeddingRequest {
        model: String,
        input: serde_json::Value,
    }
    let request: EmbeddingRequest = match read_request(&state, body).await {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    ApiError::model_not_found(format!("model '{}' does not serve embeddings (no embedding model is served)", request.model))
        .into_response()
}

impl Plan {
    fn new(
        id: RequestId,
        model: &str,
        route: EngineKind,
        streaming: bool,
        include_usage: bool,
        ticket: Arc<Ticket>,
    ) -> Self {
        let ctx = RequestContext::new(uuid::Uuid::new_v4().to_string());
        Plan {
            request_id: id.0,
            model: model.to_string(),
            route,
            streaming,
            include_usage,
            resumable: false,
            ctx,
            ticket,
            slot: None,
        }
    }

    /// Hold the request's global in-flight slot with its engine stream.
    fn holding(mut self, slot: Option<Extension<InflightSlot>>) -> Self {
        self.slot = slot.map(|Extension(s)| s);
        self
    }

    /// Mark a streamed request resumable when its headers ask for it.
    fn resumable(mut self, headers: &HeaderMap) -> Self {
        self.resumable = self.streaming && super::streams::wants_resume(headers);
        self
    }
}

/// Call the engine and answer. Everything that must stop the engine when the client
/// goes away (the guard) lives in this future or, when streaming, in the SSE body.
async fn respond<C, F>(
    state: Arc<AppState>,
    plan: Plan,
    call: impl Future<Output = Result<OpenAIStream<C>, EngineError>> + Send,
    fold: F,
) -> Response
where
    C: StreamChunk,
    F: Fold<C> + Send,
{
    let mut response = respond_inner(state, plan, call, fold).await;
    response.extensions_mut().insert(EngineLogged);
    response
}

async fn respond_inner<C, F>(
    state: Arc<AppState>,
    plan: Plan,
    call: impl Future<Output = Result<OpenAIStream<C>, EngineError>> + Send,
    mut fold: F,
) -> Response
where
    C: StreamChunk,
    F: Fold<C> + Send,
{
    let mut guard = CancelOnDrop::new(plan.ctx.clone());
    let mut metrics = state.metrics.start(&plan.request_id, &plan.model, plan.route, plan.streaming);
    let shutdown = state.shutdown.clone();
    let shutting_down = || EngineError::Unavailable("the server is shutting down".to_string());
    let ticket = plan.ticket.clone();
    let started = tokio::select! {
        r = with_ticket(ticket.clone(), call) => r,
        _ = shutdown.cancelled() => Err(shutting_down()),
    };
    let mut stream = match started {
        // The stream keeps the request's share of the model's limits and its global
        // slot until its generation ends (a detached stream's too, after its client left).
        Ok(s) => InflightSlot::hold(plan.slot.clone(), ticketed(s, ticket.clone())),
        Err(EngineError::Overloaded(message)) if !state.manager.is_routable(&plan.model) => {
            return overloaded(&format!("{message}; no worker serves the model now"));
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    state.admission.admitted(&ticket);
    if plan.streaming {
        // Await the first item so that an immediate failure gets its HTTP status.
        let first = tokio::select! {
            item = stream.next() => item,
            _ = shutdown.cancelled() => Some(Err(shutting_down())),
        };
        if let Some(Err(e)) = first {
            return ApiError::from(e).into_response();
        }
        let fallback_meta = ChunkMeta::fallback(plan.ctx.id(), &plan.model);
        let options = SseOptions { include_usage: plan.include_usage, fallback_meta, shutdown };
        if plan.resumable {
            let events = sse_bodies(first, stream, guard, metrics, options);
            return super::streams::detach(&state, &plan.request_id, events);
        }
        return sse_response(first, stream, guard, metrics, options);
    }
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = shutdown.cancelled() => Some(Err(shutting_down())),
        };
        match item {
            Some(Ok(item)) => {
                metrics.item(item.prompt_tokens, item.completion_tokens);
                fold.push(item);
            }
            Some(Err(e)) => return ApiError::from(e).into_response(),
            None => break,
        }
    }
    metrics.succeeded();
    guard.completed();
    Json(fold.finish()).into_response()
}

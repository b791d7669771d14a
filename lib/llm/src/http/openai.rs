//! `POST /v1/chat/completions` and `POST /v1/completions`: parse and validate the
//! body, find the model's engine, call it with a fresh request context, and answer
//! with SSE (`stream: true`) or one folded response.

use std::future::Future;
use std::sync::Arc;

use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use futures::StreamExt;
use serde::Serialize;

use super::error::ApiError;
use super::guard::CancelOnDrop;
use super::request::{body_or_error, parse_json};
use super::service::AppState;
use super::sse::{sse_response, ChunkMeta, SseOptions, StreamChunk};
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
    model: String,
    route: EngineKind,
    streaming: bool,
    include_usage: bool,
    ctx: RequestContext,
}

fn include_usage(options: &Option<StreamOptions>) -> bool {
    options.as_ref().is_some_and(|o| o.include_usage)
}

/// `POST /v1/chat/completions`.
pub(crate) async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let request: ChatCompletionRequest = match body_or_error(body, state.body_limit).and_then(|b| parse_json(&b)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(message) = request.validate() {
        return ApiError::bad_request(message).into_response();
    }
    let engine = match state.manager.chat_engine(&request.model) {
        Ok(e) => e,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let plan = Plan::new(&request.model, EngineKind::Chat, request.stream, include_usage(&request.stream_options));
    let fold = ChatAggregator::new(&format!("chatcmpl-{}", plan.ctx.id()), &plan.model);
    let ctx = plan.ctx.clone();
    respond(state, plan, async move { engine.chat(request, ctx).await }, fold).await
}

/// `POST /v1/completions`.
pub(crate) async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let request: CompletionRequest = match body_or_error(body, state.body_limit).and_then(|b| parse_json(&b)) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    if let Err(message) = request.validate() {
        return ApiError::bad_request(message).into_response();
    }
    let engine = match state.manager.completions_engine(&request.model) {
        Ok(e) => e,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let plan = Plan::new(&request.model, EngineKind::Completions, request.stream, include_usage(&request.stream_options));
    let fold = CompletionAggregator::new(&format!("cmpl-{}", plan.ctx.id()), &plan.model);
    let ctx = plan.ctx.clone();
    respond(state, plan, async move { engine.completion(request, ctx).await }, fold).await
}

impl Plan {
    fn new(model: &str, route: EngineKind, streaming: bool, include_usage: bool) -> Self {
        let ctx = RequestContext::new(uuid::Uuid::new_v4().to_string());
        Plan { model: model.to_string(), route, streaming, include_usage, ctx }
    }
}

/// Call the engine and answer. Everything that must stop the engine when the client
/// goes away (the guard) lives in this future or, when streaming, in the SSE body.
async fn respond<C, F>(
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
    let mut metrics = state.metrics.start(&plan.model, plan.route, plan.streaming);
    let shutdown = state.shutdown.clone();
    let shutting_down = || EngineError::Unavailable("the server is shutting down".to_string());
    let started = tokio::select! {
        r = call => r,
        _ = shutdown.cancelled() => Err(shutting_down()),
    };
    let mut stream = match started {
        Ok(s) => s,
        Err(e) => return ApiError::from(e).into_response(),
    };
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

//! A streamed response as Server-Sent Events: one `data: <chunk json>` event per
//! chunk, an optional usage chunk, then `data: [DONE]`. An error item becomes an event
//! carrying an OpenAI error object and ends the stream without `[DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::guard::CancelOnDrop;
use super::metrics::RequestMetrics;
use super::streams::EventBody;
use crate::engine::{EngineError, OpenAIStream, StreamItem, TokenTally};
use crate::protocols::openai::{ChatCompletionChunk, CompletionResponse, Usage};
use crate::protocols::unix_now;

/// The identity fields every chunk of a response shares.
#[derive(Debug, Clone)]
pub(crate) struct ChunkMeta {
    pub id: String,
    pub model: String,
    pub created: u64,
}

/// A chunk type the SSE stream can close with a usage-only chunk.
pub(crate) trait StreamChunk: Serialize + Send + 'static {
    /// This chunk's id, model and creation time.
    fn meta(&self) -> ChunkMeta;
    /// A chunk with no choices that carries `usage`.
    fn usage_only(meta: ChunkMeta, usage: Usage) -> Self;
    /// Make this a chunk of choice `index` of response `id` (`n > 1`).
    fn relabel(&mut self, index: u32, id: &str);
}

impl StreamChunk for ChatCompletionChunk {
    fn meta(&self) -> ChunkMeta {
        ChunkMeta { id: self.id.clone(), model: self.model.clone(), created: self.created }
    }

    fn usage_only(meta: ChunkMeta, usage: Usage) -> Self {
        ChatCompletionChunk {
            id: meta.id,
            object: "chat.completion.chunk".to_string(),
            created: meta.created,
            model: meta.model,
            choices: Vec::new(),
            usage: Some(usage),
        }
    }

    fn relabel(&mut self, index: u32, id: &str) {
        id.clone_into(&mut self.id);
        self.choices.iter_mut().for_each(|c| c.index = index);
    }
}

impl StreamChunk for CompletionResponse {
    fn meta(&self) -> ChunkMeta {
        ChunkMeta { id: self.id.clone(), model: self.model.clone(), created: self.created }
    }

    fn usage_only(meta: ChunkMeta, usage: Usage) -> Self {
        CompletionResponse {
            id: meta.id,
            object: "text_completion".to_string(),
            created: meta.created,
            model: meta.model,
            choices: Vec::new(),
            usage: Some(usage),
        }
    }

    fn relabel(&mut self, index: u32, id: &str) {
        id.clone_into(&mut self.id);
        self.choices.iter_mut().for_each(|c| c.index = index);
    }
}

enum Phase {
    Streaming,
    /// The engine's stream ended: the usage chunk (if asked for), then `[DONE]`.
    Closing,
    Done,
}

/// What the SSE body owns; dropping it (the client went away) drops the guard, which
/// stops the engine.
struct SseState<C> {
    first: Option<Option<Result<StreamItem<C>, EngineError>>>,
    stream: OpenAIStream<C>,
    guard: CancelOnDrop,
    metrics: RequestMetrics,
    include_usage: bool,
    meta: ChunkMeta,
    tokens: TokenTally,
    shutdown: CancellationToken,
    phase: Phase,
}

/// Options of one streamed response.
pub(crate) struct SseOptions {
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
    /// Id and model for the usage chunk when the engine sent no chunk.
    pub fallback_meta: ChunkMeta,
    /// Server shutdown: end the stream with an error event.
    pub shutdown: CancellationToken,
}

impl ChunkMeta {
    /// Meta for a response that has seen no chunk yet.
    pub(crate) fn fallback(id: &str, model: &str) -> Self {
        ChunkMeta { id: id.to_string(), model: model.to_string(), created: unix_now() }
    }
}

/// The SSE response for `stream`, whose first item (already awaited, to turn an
/// immediate error into an HTTP status) is `first`.
pub(crate) fn sse_response<C: StreamChunk>(
    first: Option<Result<StreamItem<C>, EngineError>>,
    stream: OpenAIStream<C>,
    guard: CancelOnDrop,
    metrics: RequestMetrics,
    options: SseOptions,
) -> Response {
    let events = sse_bodies(first, stream, guard, metrics, options)
        .map(|body| Ok::<_, Infallible>(Event::default().data(body.data)));
    Sse::new(events).into_response()
}

/// The events of a streamed response, serialized, for a resumable stream to buffer
/// (or [`sse_response`] to send). Dropping it before its end stops the engine.
pub(crate) fn sse_bodies<C: StreamChunk>(
    first: Option<Result<StreamItem<C>, EngineError>>,
    stream: OpenAIStream<C>,
    guard: CancelOnDrop,
    metrics: RequestMetrics,
    options: SseOptions,
) -> impl Stream<Item = EventBody> + Send {
    let state = SseState {
        first: Some(first),
        stream,
        guard,
        metrics,
        include_usage: options.include_usage,
        meta: options.fallback_meta,
        tokens: TokenTally::default(),
        shutdown: options.shutdown,
        phase: Phase::Streaming,
    };
    futures::stream::unfold(state, |mut st| async move {
        let event = st.next_event().await?;
        Some((event, st))
    })
}

fn error_event(e: EngineError) -> EventBody {
    let body = ApiError::from(e).body;
    EventBody::data(serde_json::to_string(&body).unwrap_or_else(|_| "{\"error\":{}}".to_string()))
}

impl<C: StreamChunk> SseState<C> {
    async fn next_event(&mut self) -> Option<EventBody> {
        match self.phase {
            Phase::Done => None,
            Phase::Closing => Some(self.done_event()),
            Phase::Streaming => {
                let next = match self.first.take() {
                    Some(first) => first,
                    None => tokio::select! {
                        item = self.stream.next() => item,
                        _ = self.shutdown.cancelled() => Some(Err(EngineError::Unavailable("the server is shutting down".into()))),
                    },
                };
                Some(match next {
                    Some(Ok(item)) => self.chunk_event(item),
                    Some(Err(e)) => {
                        self.phase = Phase::Done;
                        error_event(e)
                    }
                    None if self.include_usage => {
                        self.phase = Phase::Closing;
                        let usage = Usage::new(self.tokens.prompt, self.tokens.completion).with_cached(self.tokens.cached);
                        let chunk = C::usage_only(self.meta.clone(), usage);
                        self.serialize(&chunk)
                    }
                    None => self.done_event(),
                })
            }
        }
    }

    /// `[DONE]`: the response completed.
    fn done_event(&mut self) -> EventBody {
        self.phase = Phase::Done;
        self.metrics.succeeded();
        self.guard.completed();
        EventBody::data("[DONE]")
    }

    fn chunk_event(&mut self, item: StreamItem<C>) -> EventBody {
        self.metrics.item(item.prompt_tokens, item.completion_tokens);
        self.tokens.add(&item);
        self.meta = item.data.meta();
        self.serialize(&item.data)
    }

    fn serialize(&mut self, chunk: &C) -> EventBody {
        match serde_json::to_string(chunk) {
            Ok(json) => EventBody::data(json),
            Err(e) => {
                self.phase = Phase::Done;
                error_event(EngineError::Internal(format!("cannot serialize a chunk: {e}")))
            }
        }
    }
}

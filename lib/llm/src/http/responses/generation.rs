//! One response being generated: the engine's chat stream driven through a
//! [`ResponseBuilder`], yielding the response's events batch by batch, counting tokens,
//! and saving the response to the store when it ends (and, for background responses,
//! as it goes). Streamed, folded and background responses all run one of these.

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::convert;
use super::events::{Ending, ResponseBuilder, StreamEvent};
use super::protocol::{ResponseObject, ResponseUsage};
use super::store::{SharedResponseStore, StoreError, StoredResponse};
use crate::engine::{ChatStream, EngineError, TokenTally};
use crate::http::guard::CancelOnDrop;
use crate::http::metrics::RequestMetrics;
use crate::protocols::openai::ChatMessage;

/// Where a response is kept: the store and the conversation it answers.
pub(crate) struct Saver {
    pub store: SharedResponseStore,
    pub input: Vec<ChatMessage>,
    /// The request's own input items, listed (see [`super::input_items`]).
    pub input_items: Vec<serde_json::Value>,
}

/// A response in generation.
pub(crate) struct Generation {
    stream: ChatStream,
    builder: ResponseBuilder,
    guard: CancelOnDrop,
    metrics: RequestMetrics,
    shutdown: CancellationToken,
    saver: Option<Saver>,
    started: bool,
    done: bool,
    ending: Option<Ending>,
    error: Option<EngineError>,
    tokens: TokenTally,
}

impl Generation {
    /// Drive `stream` into `response`. The guard stops the engine if this is dropped
    /// before the end; `shutdown` ends the response with an error.
    pub(crate) fn new(
        response: ResponseObject,
        stream: ChatStream,
        guard: CancelOnDrop,
        metrics: RequestMetrics,
        shutdown: CancellationToken,
        saver: Option<Saver>,
    ) -> Self {
        Generation {
            stream,
            builder: ResponseBuilder::new(response),
            guard,
            metrics,
            shutdown,
            saver,
            started: false,
            done: false,
            ending: None,
            error: None,
            tokens: TokenTally::default(),
        }
    }

    /// Wait for the engine's first item: an immediate failure (no worker, a bad
    /// request) is returned, so that the caller answers with its HTTP status.
    pub(crate) async fn prime(mut self) -> Result<Self, EngineError> {
        let first = tokio::select! {
            item = self.stream.next() => item,
            _ = self.shutdown.cancelled() => Some(Err(shutting_down())),
        };
        match first {
            Some(Err(e)) => Err(e),
            first => {
                let rest = std::mem::replace(&mut self.stream, futures::stream::empty().boxed());
                self.stream = futures::stream::iter(first).chain(rest).boxed();
                Ok(self)
            }
        }
    }

    /// The response as it stands.
    pub(crate) fn response(&self) -> &ResponseObject {
        self.builder.response()
    }

    /// The engine error that ended the response, if one did.
    pub(crate) fn error(&self) -> Option<&EngineError> {
        self.error.as_ref()
    }

    /// The next events; `None` once the response has ended (and been saved).
    pub(crate) async fn next(&mut self) -> Option<Vec<StreamEvent>> {
        if self.done {
            return None;
        }
        if !self.started {
            self.started = true;
            return Some(self.builder.start());
        }
        loop {
            let item = tokio::select! {
                item = self.stream.next() => item,
                _ = self.shutdown.cancelled() => Some(Err(shutting_down())),
            };
            match item {
                Some(Ok(item)) => {
                    self.metrics.item(item.prompt_tokens, item.completion_tokens);
                    self.tokens.add(&item);
                    if let Some(ending) = convert::ending(&item.data) {
                        self.ending = Some(ending);
                    }
                    let events: Vec<StreamEvent> =
                        convert::deltas(&item.data).into_iter().flat_map(|d| self.builder.push(d)).collect();
                    if !events.is_empty() {
                        return Some(events);
                    }
                }
                Some(Err(e)) => {
                    let code = if matches!(e, EngineError::BadRequest(_)) { "invalid_prompt" } else { "server_error" };
                    let ending = Ending::Failed { code: code.to_string(), message: e.to_string() };
                    self.error = Some(e);
                    return Some(self.end(ending).await);
                }
                None => {
                    self.metrics.succeeded();
                    self.guard.completed();
                    let ending = self.ending.take().unwrap_or(Ending::Stopped);
                    return Some(self.end(ending).await);
                }
            }
        }
    }

    /// Stop generating: the engine is stopped and the response saved as `cancelled`;
    /// the events closing its open item.
    pub(crate) async fn cancel(&mut self) -> Vec<StreamEvent> {
        if self.done {
            return Vec::new();
        }
        // Dropping the stream with the guard armed stops the engine.
        self.stream = futures::stream::empty().boxed();
        self.end(Ending::Cancelled).await
    }

    async fn end(&mut self, ending: Ending) -> Vec<StreamEvent> {
        let usage = ResponseUsage::new(self.tokens.prompt, self.tokens.completion, self.tokens.cached);
        let events = self.builder.finish(ending, Some(usage));
        self.done = true;
        if let Err(e) = self.save().await {
            tracing::warn!(response = %self.response().id, error = %e, "cannot store the response");
        }
        events
    }

    /// Write the response as it stands to the store (when it is stored).
    pub(crate) async fn save(&mut self) -> Result<(), StoreError> {
        let Some(saver) = &self.saver else { return Ok(()) };
        let stored = StoredResponse {
            response: self.response().clone(),
            input: saver.input.clone(),
            input_items: saver.input_items.clone(),
        };
        saver.store.put(stored).await
    }
}

fn shutting_down() -> EngineError {
    EngineError::Unavailable("the server is shutting down".to_string())
}

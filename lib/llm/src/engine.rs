//! The two engine shapes and the error they share.
//!
//! - [`OpenAIEngine`]: OpenAI request in, OpenAI chunks out. The HTTP frontend, text
//!   and batch inputs call this. Implemented by `echo_full`, by a remote worker that
//!   registered a `chat`/`completions` model, and by the preprocessor pipeline over a
//!   [`TokenEngine`].
//! - [`TokenEngine`]: [`PreprocessedRequest`] in, [`LLMEngineOutput`] out. Implemented by
//!   `echo_core`, the mocker, and a remote worker that registered a `backend` model.
//!
//! Every call takes the request's [`RequestContext`]; an engine stops generating when
//! it is stopped or killed (a client that disconnects from the frontend stops it).

use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use dynamo_runtime::RequestContext;

use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse};

/// Why a request failed. The HTTP frontend maps each kind to a status code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The request is invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// No such model (404).
    #[error("{0}")]
    NotFound(String),
    /// No worker can take the request now (503).
    #[error("{0}")]
    Unavailable(String),
    /// Refused by an admission limit of the model: too much load now (429).
    #[error("{0}")]
    Overloaded(String),
    /// A bounded wait on the worker ran out: no first item, or too long between items (504).
    #[error("{0}")]
    Timeout(String),
    /// Anything else (500).
    #[error("{0}")]
    Internal(String),
}

impl EngineError {
    /// The HTTP status code for this error.
    pub fn status(&self) -> u16 {
        match self {
            EngineError::BadRequest(_) => 400,
            EngineError::NotFound(_) => 404,
            EngineError::Unavailable(_) => 503,
            EngineError::Overloaded(_) => 429,
            EngineError::Timeout(_) => 504,
            EngineError::Internal(_) => 500,
        }
    }
}

impl From<dynamo_runtime::Error> for EngineError {
    fn from(e: dynamo_runtime::Error) -> Self {
        use dynamo_runtime::ErrorKind;
        match e.kind() {
            ErrorKind::NoInstances | ErrorKind::InstanceNotFound | ErrorKind::Unavailable => {
                EngineError::Unavailable(e.to_string())
            }
            ErrorKind::PayloadTooLarge => EngineError::BadRequest(e.to_string()),
            ErrorKind::Timeout | ErrorKind::NotTaken => EngineError::Timeout(e.to_string()),
            // The worker vanished or stopped answering mid-request.
            ErrorKind::Disconnected => EngineError::Unavailable(e.to_string()),
            _ => EngineError::Internal(e.to_string()),
        }
    }
}

/// One item of an OpenAI-level stream, with the token counts the frontend reports
/// (`usage`, Prometheus histograms).
#[derive(Debug, Clone, PartialEq)]
pub struct StreamItem<T> {
    pub data: T,
    /// Prompt tokens; set on (at least) the first item when known.
    pub prompt_tokens: Option<u32>,
    /// Tokens generated in this item.
    pub completion_tokens: u32,
    /// Prompt tokens the engine had cached, when it says (on one item).
    pub cached_tokens: Option<u32>,
}

/// A stream's token counts so far, from its items: the prompt as last reported, the
/// completion summed, the cached prompt tokens as last reported.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenTally {
    /// Prompt tokens.
    pub prompt: u32,
    /// Tokens generated.
    pub completion: u32,
    /// Prompt tokens the engine had cached, when it said.
    pub cached: Option<u32>,
}

impl TokenTally {
    /// Count one item.
    pub fn add<T>(&mut self, item: &StreamItem<T>) {
        if let Some(p) = item.prompt_tokens {
            self.prompt = p;
        }
        self.completion += item.completion_tokens;
        if item.cached_tokens.is_some() {
            self.cached = item.cached_tokens;
        }
    }
}

impl<T> StreamItem<T> {
    /// An item with no token accounting.
    pub fn new(data: T) -> Self {
        StreamItem { data, prompt_tokens: None, completion_tokens: 0, cached_tokens: None }
    }
}

/// A stream of OpenAI-level items; an `Err` item ends the stream with that error.
pub type OpenAIStream<T> = BoxStream<'static, Result<StreamItem<T>, EngineError>>;

/// A stream of chat chunks.
pub type ChatStream = OpenAIStream<ChatCompletionChunk>;

/// A stream of completion chunks.
pub type CompletionStream = OpenAIStream<CompletionResponse>;

/// A stream of token engine output; an `Err` item ends the stream with that error.
pub type TokenStream = BoxStream<'static, Result<LLMEngineOutput, EngineError>>;

/// OpenAI request in, OpenAI chunks out. Requests reach the engine already validated
/// and always as streams (`stream: false` is folded by the caller).
#[async_trait]
pub trait OpenAIEngine: Send + Sync + 'static {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError>;
    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError>;
}

/// Token ids in, token ids out.
#[async_trait]
pub trait TokenEngine: Send + Sync + 'static {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError>;
}

/// Builds the OpenAI engine of a `backend` model from its card (JSON) and the token
/// engine that reaches its workers; in practice the preprocessor pipeline
/// ([`crate::frontend::ModelWatcher`] calls it for each model it finds).
pub type EngineFactory =
    Arc<dyn Fn(serde_json::Value, Arc<dyn TokenEngine>) -> Result<Arc<dyn OpenAIEngine>, String> + Send + Sync>;

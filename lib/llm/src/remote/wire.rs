//! What travels between a frontend and a worker serving a model over the runtime's
//! request plane.
//!
//! - OpenAI engines (`chat`/`completions` models): the request is the OpenAI request
//!   JSON (a chat request has `messages`); each item is
//!   `{"data": <chunk>, "prompt_tokens": n (optional), "completion_tokens": n}`. A bare
//!   chunk (no `data` key, as a Python worker may yield) is accepted too, with no token
//!   counts.
//! - Token engines (`backend` models): the request is a `PreprocessedRequest`, each item
//!   an `LLMEngineOutput`.
//!
//! An engine error ends the stream through the runtime's error frame whose message is
//! `{"status": 400|404|503|500, "message": "..."}`, so the frontend answers with the
//! same HTTP status as an in-process engine would. Any other error message (a Python
//! exception) is a 500 (or a 503 when the plane reports the worker unreachable).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::engine::{EngineError, StreamItem};

/// One item of a remote OpenAI engine's stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpenAIWireItem<T> {
    /// The chunk.
    pub data: T,
    /// Prompt tokens, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u32>,
    /// Tokens generated in this item.
    #[serde(default)]
    pub completion_tokens: u32,
    /// Prompt tokens the engine had cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
}

impl<T> From<StreamItem<T>> for OpenAIWireItem<T> {
    fn from(item: StreamItem<T>) -> Self {
        OpenAIWireItem {
            data: item.data,
            prompt_tokens: item.prompt_tokens,
            completion_tokens: item.completion_tokens,
            cached_tokens: item.cached_tokens,
        }
    }
}

impl<T> From<OpenAIWireItem<T>> for StreamItem<T> {
    fn from(item: OpenAIWireItem<T>) -> Self {
        StreamItem {
            data: item.data,
            prompt_tokens: item.prompt_tokens,
            completion_tokens: item.completion_tokens,
            cached_tokens: item.cached_tokens,
        }
    }
}

/// An item as received: the envelope, or a bare chunk.
#[derive(Deserialize)]
#[serde(untagged)]
enum ReceivedItem<T> {
    Envelope(OpenAIWireItem<T>),
    Bare(T),
}

/// Decode one OpenAI item from a worker.
pub fn decode_openai_item<T: DeserializeOwned>(body: &[u8]) -> Result<StreamItem<T>, EngineError> {
    match serde_json::from_slice::<ReceivedItem<T>>(body) {
        Ok(ReceivedItem::Envelope(item)) => Ok(item.into()),
        Ok(ReceivedItem::Bare(data)) => Ok(StreamItem::new(data)),
        Err(e) => Err(EngineError::Internal(format!("the worker sent an item that is not a chunk: {e}"))),
    }
}

/// An engine error as carried in the runtime's error frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// The HTTP status of the error.
    pub status: u16,
    /// What went wrong.
    pub message: String,
}

impl From<&EngineError> for WireError {
    fn from(e: &EngineError) -> Self {
        WireError { status: e.status(), message: e.to_string() }
    }
}

impl From<WireError> for EngineError {
    fn from(e: WireError) -> Self {
        match e.status {
            400 => EngineError::BadRequest(e.message),
            404 => EngineError::NotFound(e.message),
            503 => EngineError::Unavailable(e.message),
            504 => EngineError::Timeout(e.message),
            _ => EngineError::Internal(e.message),
        }
    }
}

/// The error-frame message for `e` (worker side).
pub fn encode_error(e: &EngineError) -> String {
    serde_json::to_string(&WireError::from(e)).unwrap_or_else(|_| e.to_string())
}

/// The engine error for a runtime error (frontend side): an engine error sent by the
/// worker keeps its status; the rest map by kind.
pub fn decode_error(e: dynamo_runtime::Error) -> EngineError {
    if e.kind() == dynamo_runtime::ErrorKind::Handler {
        if let Ok(wire) = serde_json::from_str::<WireError>(e.message()) {
            return wire.into();
        }
    }
    EngineError::from(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::{CompletionChoice, CompletionResponse};

    #[test]
    fn items_round_trip_and_bare_chunks_are_accepted() {
        let chunk = CompletionResponse::new("c", "m", 1, CompletionChoice { text: "x".into(), ..Default::default() });
        let item = StreamItem { data: chunk.clone(), prompt_tokens: Some(3), completion_tokens: 1, cached_tokens: Some(2) };
        let bytes = serde_json::to_vec(&OpenAIWireItem::from(item.clone())).unwrap();
        assert_eq!(decode_openai_item::<CompletionResponse>(&bytes).unwrap(), item);
        let bare = serde_json::to_vec(&chunk).unwrap();
        assert_eq!(decode_openai_item::<CompletionResponse>(&bare).unwrap(), StreamItem::new(chunk));
        assert!(decode_openai_item::<CompletionResponse>(b"[1]").is_err());
    }

    #[test]
    fn errors_keep_their_status_across_the_wire() {
        let sent = EngineError::BadRequest("prompt too long".into());
        let runtime_error = dynamo_runtime::Error::new(dynamo_runtime::ErrorKind::Handler, encode_error(&sent));
        assert_eq!(decode_error(runtime_error), sent);
        let python = dynamo_runtime::Error::new(dynamo_runtime::ErrorKind::Handler, "ValueError: x");
        assert_eq!(decode_error(python), EngineError::Internal("ValueError: x".into()));
        let gone = dynamo_runtime::Error::new(dynamo_runtime::ErrorKind::NoInstances, "none");
        assert!(matches!(decode_error(gone), EngineError::Unavailable(_)));
    }
}

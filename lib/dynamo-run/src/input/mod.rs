//! The inputs: where requests come from. Each `run` returns when its work is done or
//! the cancellation token (SIGINT/SIGTERM) fires, after shutting down what it started.

pub mod batch;
pub mod chat;
pub mod endpoint;
pub mod http;
mod probe;

use dynamo_llm::protocols::openai::{ChatCompletionRequest, ChatMessage};

/// A chat message with plain text content.
pub(crate) fn message(role: &str, text: String) -> ChatMessage {
    ChatMessage::text(role, text)
}

/// A streaming chat request for `model`, as the text, stdin and batch inputs send it.
pub(crate) fn chat_request(model: &str, messages: Vec<ChatMessage>, max_tokens: Option<u32>) -> ChatCompletionRequest {
    ChatCompletionRequest { model: model.to_string(), messages, stream: true, max_tokens, ..Default::default() }
}

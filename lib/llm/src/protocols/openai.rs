//! The subset of the OpenAI HTTP API that the frontend serves: chat completions,
//! completions, their streamed chunks, usage, model lists and error bodies.
//!
//! Unknown request fields are ignored (as vLLM does); fields we read are typed, so a
//! wrong type is a 400 with serde's message. [`ChatCompletionRequest::validate`] and
//! [`CompletionRequest::validate`] check value ranges and the tool fields
//! ([`super::tools`]), and refuse (400) the OpenAI fields that are not implemented
//! (`functions`, `logit_bias`, `best_of`, `suffix` …) rather than ignore them.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Most choices per request (`n`).
pub const MAX_N: u32 = 16;
/// Most `top_logprobs` (chat) and `logprobs` (completions) alternatives per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;

/// `response_format`: plain text, any JSON object, or JSON matching a schema. The
/// engine receives it in the preprocessed request; engines that cannot constrain
/// their output ignore it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// `{"type": "text"}`.
    Text,
    /// `{"type": "json_object"}`.
    JsonObject,
    /// `{"type": "json_schema", "json_schema": {...}}`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// The `json_schema` of a `response_format`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// A JSON Schema (a JSON object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl ResponseFormat {
    /// Check the shape: a schema, when given, is a JSON object; the name is not empty.
    pub fn validate(&self) -> Result<(), String> {
        if let ResponseFormat::JsonSchema { json_schema } = self {
            if json_schema.name.trim().is_empty() {
                return Err("response_format.json_schema.name must not be empty".to_string());
            }
            if json_schema.schema.as_ref().is_some_and(|s| !s.is_object()) {
                return Err("response_format.json_schema.schema must be a JSON object".to_string());
            }
        }
        Ok(())
    }
}

/// Dynamo's extensions to a request body (`"nvext": {...}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvExt {
    /// Generate until `max_tokens`, ignoring EOS and stop conditions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Send the prompt as written, without the chat template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub use_raw_prompt: Option<bool>,
    /// Extra items to return (`"formatted_prompt"`, `"token_ids"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<Vec<String>>,
}

/// The sampling fields chat and completions requests share, flattened into both (the
/// JSON keeps OpenAI's shape), with vLLM's top-level extensions (`top_k`, `min_p`,
/// `repetition_penalty`, `min_tokens`, `ignore_eos`; also accepted in `nvext`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Choices to generate (1–[`MAX_N`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// 0–2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// In (0, 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    /// vLLM extension: sample among the k most likely tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    /// vLLM extension: drop tokens below this fraction of the most likely one's probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    /// vLLM extension: penalise tokens already in the prompt or the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    /// vLLM extension: generate at least this many tokens before a stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// vLLM extension: generate until `max_tokens`, ignoring EOS and stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
}

impl SamplingParams {
    /// Range checks shared by both request kinds (with the request's `max_tokens`); the
    /// message names the field.
    pub fn validate(&self, max_tokens: Option<u32>) -> Result<(), String> {
        if let Some(t) = self.temperature {
            if !(0.0..=2.0).contains(&t) {
                return Err(format!("temperature must be between 0 and 2, got {t}"));
            }
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(format!("top_p must be in (0, 1], got {p}"));
            }
        }
        if let Some(n) = self.n {
            if !(1..=MAX_N).contains(&n) {
                return Err(format!("n must be between 1 and {MAX_N}, got {n}"));
            }
        }
        if max_tokens == Some(0) {
            return Err("max_tokens must be at least 1".to_string());
        }
        Ok(())
    }

    /// These fields, with the extensions a request left out at the top level taken
    /// from its `nvext` (the top level wins when both are set).
    pub fn with_nvext(&self, nvext: Option<&NvExt>) -> SamplingParams {
        let Some(ext) = nvext else { return self.clone() };
        SamplingParams {
            top_k: self.top_k.or(ext.top_k),
            min_p: self.min_p.or(ext.min_p),
            repetition_penalty: self.repetition_penalty.or(ext.repetition_penalty),
            min_tokens: self.min_tokens.or(ext.min_tokens),
            ignore_eos: self.ignore_eos.or(ext.ignore_eos),
            ..self.clone()
        }
    }
}

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    One(String),
    Many(Vec<String>),
}

impl StopSpec {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamOptions {
    /// Send a final chunk with `usage` and no choices.
    #[serde(default)]
    pub include_usage: bool,
}

/// A content part of a message (`{"type": "text", "text": "..."}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A message's content: a string or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The length in bytes of [`MessageContent::text`], without building it.
    pub fn text_len(&self) -> usize {
        match self {
            MessageContent::Text(s) => s.len(),
            MessageContent::Parts(parts) => parts.iter().filter_map(|p| p.text.as_ref()).map(String::len).sum(),
        }
    }

    /// The text of the content (text parts joined).
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(parts) => parts.iter().filter_map(|p| p.text.as_deref()).collect::<Vec<_>>().join(""),
        }
    }
}

/// One message of a chat request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool` (any string is accepted).
    pub role: String,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl ChatMessage {
    /// A message of `role` with plain text content.
    pub fn text(role: &str, text: String) -> Self {
        ChatMessage {
            role: role.to_string(),
            content: Some(MessageContent::Text(text)),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }
}

/// `POST /v1/chat/completions` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// Deprecated by OpenAI in favour of `max_completion_tokens`; both are read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<u32>,
    /// The sampling fields (and vLLM's top-level extensions), at the top level of the JSON.
    #[serde(flatten)]
    pub sampling: SamplingParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSpec>,
    /// Functions the model may call (`{"type": "function", "function": {...}}`), passed
    /// to the chat template as they are; checked by [`super::tools::ToolRequest`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": …}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Whether the model may make more than one call (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Extra variables for the chat template (vLLM's extension), e.g.
    /// `{"enable_thinking": false}` for Qwen3; the reasoning parser reads that one too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// Return each token's log probability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Alternatives per token with their log probabilities (0–20; needs `logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Not implemented: refused unless empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<HashMap<String, f32>>,
    /// Not implemented (the legacy form of `tools`): refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub functions: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<NvExt>,
}

/// `prompt` of a completions request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    /// Only a one-element list is served (batched prompts are a 400).
    TextList(Vec<String>),
    Tokens(Vec<u32>),
}

/// `POST /v1/completions` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: Prompt,
    #[serde(default)]
    pub stream: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// The sampling fields (and vLLM's top-level extensions), at the top level of the JSON.
    #[serde(flatten)]
    pub sampling: SamplingParams,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Return the log probabilities of each token and of this many alternatives (0–20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Not implemented: refused unless 1 (or equal to `n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    /// Not implemented: refused unless empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suffix: Option<String>,
    /// Not implemented: refused unless empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<HashMap<String, f32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvext: Option<NvExt>,
}

impl ChatCompletionRequest {
    /// `max_completion_tokens`, else `max_tokens`.
    pub fn max_tokens(&self) -> Option<u32> {
        self.max_completion_tokens.or(self.max_tokens)
    }

    /// Check value ranges; the error is a client error (400) naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.messages.is_empty() {
            return Err("messages must not be empty".to_string());
        }
        if self.functions.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(not_supported("functions", "send them as `tools`"));
        }
        super::tools::ToolRequest::from_request(self)?;
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(not_supported("logit_bias", "the engines do not bias sampling"));
        }
        if let Some(top) = self.top_logprobs {
            if top > MAX_TOP_LOGPROBS {
                return Err(format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"));
            }
            if !self.wants_logprobs() {
                return Err("top_logprobs needs logprobs: true".to_string());
            }
        }
        if let Some(format) = &self.response_format {
            format.validate()?;
        }
        self.sampling.validate(self.max_tokens())
    }

    /// Whether the request lets the model think (`chat_template_kwargs.enable_thinking`,
    /// default true).
    pub fn enable_thinking(&self) -> bool {
        self.chat_template_kwargs.as_ref().and_then(|k| k.get("enable_thinking")).and_then(Value::as_bool).unwrap_or(true)
    }

    /// Whether the client asked for log probabilities.
    pub fn wants_logprobs(&self) -> bool {
        self.logprobs.unwrap_or(false)
    }
}

impl CompletionRequest {
    /// Check value ranges; the error is a client error (400) naming the field.
    pub fn validate(&self) -> Result<(), String> {
        if let Prompt::TextList(list) = &self.prompt {
            if list.len() != 1 {
                return Err(format!("prompt must be a string or a list of one string, got a list of {}", list.len()));
            }
        }
        if let Some(best_of) = self.best_of {
            if best_of != self.sampling.n.unwrap_or(1) {
                return Err(not_supported("best_of", "set it to n (or leave it out)"));
            }
        }
        if self.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(not_supported("suffix", "insertion is not implemented"));
        }
        if self.logit_bias.as_ref().is_some_and(|b| !b.is_empty()) {
            return Err(not_supported("logit_bias", "the engines do not bias sampling"));
        }
        if let Some(top) = self.logprobs {
            if top > MAX_TOP_LOGPROBS {
                return Err(format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {top}"));
            }
        }
        if let Some(format) = &self.response_format {
            format.validate()?;
        }
        self.sampling.validate(self.max_tokens)
    }
}

/// The message for a field we know but do not implement.
fn not_supported(field: &str, why: &str) -> String {
    format!("{field} is not supported by this server: {why}")
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
    /// How many prompt tokens the engine found cached, when it says (vLLM reports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

/// OpenAI's breakdown of the prompt tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptTokensDetails {
    /// Prompt tokens served from the engine's prefix cache.
    pub cached_tokens: u32,
}

impl Usage {
    pub fn new(prompt_tokens: u32, completion_tokens: u32) -> Self {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens, prompt_tokens_details: None }
    }

    /// The same counts with the engine's cached prompt tokens, when it reported them.
    pub fn with_cached(mut self, cached_tokens: Option<u32>) -> Self {
        self.prompt_tokens_details = cached_tokens.map(|cached_tokens| PromptTokensDetails { cached_tokens });
        self
    }
}

/// The function part of a tool call (whole in a response, a piece in a delta).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name (in a delta: on the call's first piece only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The arguments, a JSON object's text (in a delta: a piece of it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<String>,
}

/// A tool call in a chat delta (`tool_calls[i]`) or a whole message (`index` absent).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCallItem {
    /// The call's position among the response's calls (deltas only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
    /// `call_` and 24 hex digits (in a delta: on the call's first piece only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `"function"` (in a delta: on the call's first piece only).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// The delta of a streamed chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatDelta {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The model's thinking, split out by the model's reasoning parser.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// Tool calls, split out of the output (each call whole in one delta here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallItem>>,
}

/// One choice of a `chat.completion.chunk`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChunkChoice {
    pub index: u32,
    pub delta: ChatDelta,
    /// `null` until the last chunk of the choice.
    pub finish_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<Value>,
}

/// `object: "chat.completion.chunk"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionChunk {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChunkChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl ChatCompletionChunk {
    /// A chunk with one choice.
    pub fn new(id: &str, model: &str, created: u64, choice: ChatChunkChoice) -> Self {
        ChatCompletionChunk {
            id: id.to_string(),
            object: "chat.completion.chunk".to_string(),
            created,
            model: model.to_string(),
            choices: vec![choice],
            usage: None,
        }
    }
}

/// A streamed chunk that can say whether it ends its response.
pub trait FinishingChunk {
    /// Whether a choice of this chunk carries a finish reason.
    fn finishes(&self) -> bool;
}

impl FinishingChunk for ChatCompletionChunk {
    fn finishes(&self) -> bool {
        self.choices.iter().any(|c| c.finish_reason.is_some())
    }
}

/// The assistant message of a whole chat response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatResponseMessage {
    pub role: String,
    pub content: Option<String>,
    /// The model's thinking, when the model has a reasoning parser and thought.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls the model made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallItem>>,
}

/// One choice of a whole chat response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    pub index: u32,
    pub message: ChatResponseMessage,
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub logprobs: Option<Value>,
}

/// `object: "chat.completion"` (a non-streamed response, folded from the chunks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<ChatChoice>,
    pub usage: Usage,
}

/// One choice of a completion (chunk or whole).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    pub index: u32,
    pub text: String,
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub logprobs: Option<Value>,
}

/// `object: "text_completion"`: both the streamed chunks and the whole response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub model: String,
    pub choices: Vec<CompletionChoice>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

impl FinishingChunk for CompletionResponse {
    fn finishes(&self) -> bool {
        self.choices.iter().any(|c| c.finish_reason.is_some())
    }
}

impl CompletionResponse {
    /// A chunk (or response) with one choice.
    pub fn new(id: &str, model: &str, created: u64, choice: CompletionChoice) -> Self {
        CompletionResponse {
            id: id.to_string(),
            object: "text_completion".to_string(),
            created,
            model: model.to_string(),
            choices: vec![choice],
            usage: None,
        }
    }
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelObject {
    pub id: String,
    pub object: String,
    pub created: u64,
    pub owned_by: String,
}

/// `GET /v1/models` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelList {
    pub object: String,
    pub data: Vec<ModelObject>,
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ErrorBody {
    pub fn new(message: impl Into<String>, kind: impl Into<String>, code: Option<&str>) -> Self {
        ErrorBody { error: ErrorDetail { message: message.into(), kind: kind.into(), param: None, code: code.map(String::from) } }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request_parses_openai_shapes() {
        let req: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"system","content":"s"},
                {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],
                "stop":"x","stream":true,"max_completion_tokens":5,"unknown_field":1}"#,
        )
        .unwrap();
        assert_eq!(req.messages[1].content.as_ref().unwrap().text(), "ab");
        assert_eq!(req.stop.clone().unwrap().into_vec(), vec!["x".to_string()]);
        assert_eq!(req.max_tokens(), Some(5));
        assert!(req.validate().is_ok());
    }

    #[test]
    fn validation_names_the_field() {
        let mut req = ChatCompletionRequest { model: "m".into(), ..Default::default() };
        assert!(req.validate().unwrap_err().contains("messages"));
        req.messages.push(ChatMessage { role: "user".into(), content: None, name: None, tool_calls: None, tool_call_id: None });
        req.sampling.temperature = Some(3.0);
        assert!(req.validate().unwrap_err().contains("temperature"));
    }

    #[test]
    fn both_request_kinds_read_the_sampling_fields_and_vllm_extensions_at_the_top_level() {
        let fields = r#""temperature":0.5,"top_p":0.9,"n":2,"seed":7,"presence_penalty":0.1,"frequency_penalty":0.2,
            "top_k":5,"min_p":0.05,"repetition_penalty":1.1,"min_tokens":3,"ignore_eos":true"#;
        let expected = SamplingParams {
            n: Some(2),
            temperature: Some(0.5),
            top_p: Some(0.9),
            seed: Some(7),
            presence_penalty: Some(0.1),
            frequency_penalty: Some(0.2),
            top_k: Some(5),
            min_p: Some(0.05),
            repetition_penalty: Some(1.1),
            min_tokens: Some(3),
            ignore_eos: Some(true),
        };
        let chat: ChatCompletionRequest =
            serde_json::from_str(&format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],{fields}}}"#)).unwrap();
        let completion: CompletionRequest = serde_json::from_str(&format!(r#"{{"model":"m","prompt":"x",{fields}}}"#)).unwrap();
        assert_eq!(chat.sampling, expected);
        assert_eq!(completion.sampling, expected);
        // The fields stay at the top level when a request is written back (remote OpenAI engines).
        let json = serde_json::to_value(&completion).unwrap();
        assert_eq!(json["temperature"], 0.5);
        assert_eq!(json["top_k"], 5);
        assert!(json.get("sampling").is_none());
        let back: CompletionRequest = serde_json::from_value(json).unwrap();
        assert_eq!(back, completion);
        let empty = serde_json::to_value(ChatCompletionRequest { model: "m".into(), ..Default::default() }).unwrap();
        assert_eq!(empty, serde_json::json!({"model": "m", "messages": [], "stream": false}));
    }

    #[test]
    fn both_request_kinds_validate_the_sampling_fields_alike() {
        let completion = |fields: &str| -> CompletionRequest {
            serde_json::from_str(&format!(r#"{{"model":"m","prompt":"x",{fields}}}"#)).unwrap()
        };
        let chat = |fields: &str| -> ChatCompletionRequest {
            serde_json::from_str(&format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],{fields}}}"#)).unwrap()
        };
        for (fields, field) in [(r#""top_p":0"#, "top_p"), (r#""n":0"#, "n"), (r#""temperature":2.5"#, "temperature"), (r#""max_tokens":0"#, "max_tokens")] {
            assert!(chat(fields).validate().unwrap_err().contains(field), "{fields}");
            assert!(completion(fields).validate().unwrap_err().contains(field), "{fields}");
        }
        assert!(chat(r#""temperature":1"#).validate().is_ok());
        assert!(completion(r#""temperature":1"#).validate().is_ok());
    }

    #[test]
    fn the_top_level_extensions_win_over_nvext() {
        let ext = NvExt { top_k: Some(1), min_p: Some(0.5), ignore_eos: Some(true), ..Default::default() };
        let top = SamplingParams { top_k: Some(9), ..Default::default() };
        let merged = top.with_nvext(Some(&ext));
        assert_eq!((merged.top_k, merged.min_p, merged.ignore_eos, merged.min_tokens), (Some(9), Some(0.5), Some(true), None));
        assert_eq!(top.with_nvext(None), top);
    }

    #[test]
    fn wrong_type_is_an_error() {
        let e = serde_json::from_str::<ChatCompletionRequest>(r#"{"model":"m","messages":[],"max_tokens":"ten"}"#);
        assert!(e.is_err());
    }

    #[test]
    fn prompt_forms() {
        let r: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":[1,2,3]}"#).unwrap();
        assert_eq!(r.prompt, Prompt::Tokens(vec![1, 2, 3]));
        let r: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":["a","b"]}"#).unwrap();
        assert!(r.validate().unwrap_err().contains("prompt"));
    }
}

//! The wire types of `/v1/responses`, shaped as the official API (and the `openai`
//! package's `types/responses/`): the create request, the Response object, its output
//! items and usage.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocols::openai::SamplingParams;

/// `POST /v1/responses` body. Fields this server does not implement are read so that
/// they can be refused by name (see [`super::convert`]); `reasoning` (effort),
/// `include`, `service_tier` and other hints are ignored.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CreateRequest {
    pub model: String,
    pub input: Input,
    #[serde(default)]
    pub instructions: Option<String>,
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// `temperature`, `top_p`, `seed` and vLLM's extensions (`top_k`, …), as in chat.
    #[serde(flatten)]
    pub sampling: SamplingParams,
    #[serde(default)]
    pub stream: bool,
    /// Keep the response for `GET`/`previous_response_id` (default true, as OpenAI).
    #[serde(default)]
    pub store: Option<bool>,
    #[serde(default)]
    pub background: bool,
    #[serde(default)]
    pub previous_response_id: Option<String>,
    #[serde(default)]
    pub metadata: Option<Map<String, Value>>,
    #[serde(default)]
    pub user: Option<String>,
    /// Function tools in the Responses API's flat shape (`{"type": "function", "name",
    /// "description", "parameters", "strict"}`), see [`super::tools`].
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": …}`.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Whether the model may make more than one call (default true).
    #[serde(default)]
    pub parallel_tool_calls: Option<bool>,
    #[serde(default)]
    pub text: Option<Value>,
    #[serde(default)]
    pub truncation: Option<String>,
    #[serde(default)]
    pub conversation: Option<Value>,
    #[serde(default)]
    pub prompt: Option<Value>,
    #[serde(default)]
    pub top_logprobs: Option<u32>,
}

/// `input`: a string (one user message) or a list of items.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(crate) enum Input {
    Text(String),
    /// Kept as JSON and read item by item, so that an unsupported item or content part
    /// is refused naming its place (`input[2].content[0].type`).
    Items(Vec<Value>),
}

/// A response's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Status {
    Queued,
    InProgress,
    Completed,
    Incomplete,
    Failed,
    Cancelled,
}

impl Status {
    /// Whether the response is over (no more output will come).
    pub(crate) fn is_terminal(self) -> bool {
        !matches!(self, Status::Queued | Status::InProgress)
    }
}

/// The state of one output item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ItemStatus {
    InProgress,
    Completed,
    Incomplete,
}

/// The Response object (`object: "response"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResponseObject {
    /// `resp_…`.
    pub id: String,
    pub object: String,
    pub created_at: u64,
    pub status: Status,
    pub background: bool,
    pub error: Option<ResponseError>,
    pub incomplete_details: Option<IncompleteDetails>,
    pub instructions: Option<String>,
    pub max_output_tokens: Option<u32>,
    pub model: String,
    pub output: Vec<OutputItem>,
    pub parallel_tool_calls: bool,
    pub previous_response_id: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// `"none"`, `"auto"`, `"required"` or `{"type": "function", "name": …}`.
    pub tool_choice: Value,
    pub tools: Vec<Value>,
    pub store: bool,
    pub metadata: Map<String, Value>,
    pub text: Value,
    pub truncation: String,
    pub user: Option<String>,
    pub usage: Option<ResponseUsage>,
    pub completed_at: Option<u64>,
}

/// Why a response failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResponseError {
    /// `server_error`, `invalid_prompt`, `rate_limit_exceeded`.
    pub code: String,
    pub message: String,
}

/// Why a response is `incomplete`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct IncompleteDetails {
    /// `max_output_tokens`.
    pub reason: String,
}

/// One item of `output`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum OutputItem {
    /// The assistant's answer: `output_text` parts.
    Message { id: String, role: String, status: ItemStatus, content: Vec<ContentPart> },
    /// The model's reasoning: `reasoning_text` parts (no summary is made).
    Reasoning { id: String, summary: Vec<Value>, content: Vec<ContentPart>, status: ItemStatus },
    /// A call of one of the request's function tools (`fc_…`); `call_id` pairs it with
    /// the client's `function_call_output`.
    FunctionCall { id: String, call_id: String, name: String, arguments: String, status: ItemStatus },
}

impl OutputItem {
    /// The item's id (`msg_…`, `rs_…`, `fc_…`).
    pub(crate) fn id(&self) -> &str {
        match self {
            OutputItem::Message { id, .. } | OutputItem::Reasoning { id, .. } | OutputItem::FunctionCall { id, .. } => id,
        }
    }

    /// The content parts of a message or reasoning item (a function call has none).
    pub(crate) fn content(&self) -> &[ContentPart] {
        match self {
            OutputItem::Message { content, .. } | OutputItem::Reasoning { content, .. } => content,
            OutputItem::FunctionCall { .. } => &[],
        }
    }

    /// The content parts of a message or reasoning item, to add to.
    pub(crate) fn content_mut(&mut self) -> Option<&mut Vec<ContentPart>> {
        match self {
            OutputItem::Message { content, .. } | OutputItem::Reasoning { content, .. } => Some(content),
            OutputItem::FunctionCall { .. } => None,
        }
    }

    pub(crate) fn set_status(&mut self, to: ItemStatus) {
        match self {
            OutputItem::Message { status, .. }
            | OutputItem::Reasoning { status, .. }
            | OutputItem::FunctionCall { status, .. } => *status = to,
        }
    }
}

/// A content part of an output item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ContentPart {
    OutputText { text: String, annotations: Vec<Value>, logprobs: Vec<Value> },
    ReasoningText { text: String },
}

impl ContentPart {
    pub(crate) fn text(&self) -> &str {
        match self {
            ContentPart::OutputText { text, .. } | ContentPart::ReasoningText { text } => text,
        }
    }

    pub(crate) fn text_mut(&mut self) -> &mut String {
        match self {
            ContentPart::OutputText { text, .. } | ContentPart::ReasoningText { text } => text,
        }
    }
}

/// `usage` of a response.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ResponseUsage {
    pub input_tokens: u32,
    pub input_tokens_details: InputTokensDetails,
    pub output_tokens: u32,
    pub output_tokens_details: OutputTokensDetails,
    pub total_tokens: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct InputTokensDetails {
    pub cached_tokens: u32,
    pub cache_write_tokens: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct OutputTokensDetails {
    pub reasoning_tokens: u32,
}

impl ResponseUsage {
    pub(crate) fn new(input: u32, output: u32, cached: Option<u32>) -> Self {
        ResponseUsage {
            input_tokens: input,
            input_tokens_details: InputTokensDetails { cached_tokens: cached.unwrap_or(0), cache_write_tokens: 0 },
            output_tokens: output,
            output_tokens_details: OutputTokensDetails::default(),
            total_tokens: input + output,
        }
    }
}

/// `DELETE /v1/responses/{id}` answer.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Deleted {
    pub id: String,
    pub object: &'static str,
    pub deleted: bool,
}

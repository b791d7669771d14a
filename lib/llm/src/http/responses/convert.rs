//! Between the Responses API and our chat pipeline: a create request (with the stored
//! conversation it continues) becomes a chat request; a chat chunk becomes deltas for
//! [`super::events::ResponseBuilder`]. Unsupported fields and input items are refused
//! here, naming them.

use serde_json::Value;

use super::events::{Delta, Ending};
use super::protocol::{ContentPart, CreateRequest, Input, OutputItem, ResponseObject, Status};
use crate::http::error::ApiError;
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, ChatMessage};
use crate::protocols::unix_now;

/// A fresh Response object for `model` with nothing generated yet.
pub(crate) fn new_response(id: &str, model: &str, status: Status) -> ResponseObject {
    ResponseObject {
        id: id.to_string(),
        object: "response".to_string(),
        created_at: unix_now(),
        status,
        background: false,
        error: None,
        incomplete_details: None,
        instructions: None,
        max_output_tokens: None,
        model: model.to_string(),
        output: Vec::new(),
        parallel_tool_calls: false,
        previous_response_id: None,
        temperature: None,
        top_p: None,
        tool_choice: "none".to_string(),
        tools: Vec::new(),
        store: true,
        metadata: serde_json::Map::new(),
        text: serde_json::json!({"format": {"type": "text"}}),
        truncation: "disabled".to_string(),
        user: None,
        usage: None,
        completed_at: None,
    }
}

/// The Response object `request` starts, with id `id`.
pub(crate) fn response_for(request: &CreateRequest, id: &str) -> ResponseObject {
    let status = if request.background { Status::Queued } else { Status::InProgress };
    ResponseObject {
        background: request.background,
        instructions: request.instructions.clone(),
        max_output_tokens: request.max_output_tokens,
        previous_response_id: request.previous_response_id.clone(),
        temperature: request.sampling.temperature,
        top_p: request.sampling.top_p,
        store: request.store.unwrap_or(true),
        metadata: request.metadata.clone().unwrap_or_default(),
        user: request.user.clone(),
        ..new_response(id, &request.model, status)
    }
}

/// Refuse what this server does not implement, naming the field.
pub(crate) fn check_supported(request: &CreateRequest) -> Result<(), ApiError> {
    let refuse = |field: &str, why: &str| {
        Err(ApiError::bad_field(format!("'{field}' is not supported by this server: {why}"), Some(field.to_string())))
    };
    if request.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return refuse("tools", "tools and function calls are not served on /v1/responses");
    }
    if let Some(choice) = &request.tool_choice {
        if !matches!(choice.as_str(), Some("none" | "auto")) {
            return refuse("tool_choice", "no tools are served on /v1/responses");
        }
    }
    if request.conversation.is_some() {
        return refuse("conversation", "use previous_response_id");
    }
    if request.prompt.is_some() {
        return refuse("prompt", "prompt templates are not stored here");
    }
    if request.top_logprobs.is_some_and(|n| n > 0) {
        return refuse("top_logprobs", "log probabilities are not returned on /v1/responses");
    }
    if request.sampling.n.is_some_and(|n| n != 1) {
        return refuse("n", "a response has one output");
    }
    if let Some(text) = &request.text {
        let kind = text.pointer("/format/type").and_then(Value::as_str).unwrap_or("text");
        if kind != "text" {
            return refuse("text.format", "only plain text output is served");
        }
    }
    if let Some(truncation) = request.truncation.as_deref() {
        if truncation != "disabled" && truncation != "auto" {
            return Err(ApiError::bad_field(
                format!("truncation must be 'disabled' or 'auto', got '{truncation}'"),
                Some("truncation".to_string()),
            ));
        }
    }
    if request.max_output_tokens == Some(0) {
        return Err(ApiError::bad_field("max_output_tokens must be at least 1", Some("max_output_tokens".to_string())));
    }
    if request.background && request.store == Some(false) {
        return refuse("background", "a background response must be stored (store: true)");
    }
    request.sampling.validate(None).map_err(ApiError::bad_request)
}

/// The messages of `input`, in order (`instructions` are not among them).
pub(crate) fn input_messages(input: &Input) -> Result<Vec<ChatMessage>, ApiError> {
    match input {
        Input::Text(text) => Ok(vec![message("user", text.clone())]),
        Input::Items(items) => {
            let mut messages = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                if let Some(m) = item_message(item, i)? {
                    messages.push(m);
                }
            }
            Ok(messages)
        }
    }
}

/// One input item as a message; reasoning items (a client replaying output) are skipped.
fn item_message(item: &Value, i: usize) -> Result<Option<ChatMessage>, ApiError> {
    let field = |name: &str| format!("input[{i}].{name}");
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("message");
    match kind {
        "message" => {}
        "reasoning" => return Ok(None),
        other => {
            return Err(ApiError::bad_field(
                format!("input item type '{other}' is not supported (only 'message' items are)"),
                Some(field("type")),
            ))
        }
    }
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        Some("developer") => "system",
        Some(other) => {
            return Err(ApiError::bad_field(
                format!("role must be user, assistant, system or developer, got '{other}'"),
                Some(field("role")),
            ))
        }
        None => return Err(ApiError::bad_field("a message item needs a 'role'", Some(field("role")))),
    };
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let part_field = || format!("input[{i}].content[{j}].type");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => match part.get("text").and_then(Value::as_str) {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(ApiError::bad_field(
                                "a text part needs a string 'text'",
                                Some(format!("input[{i}].content[{j}].text")),
                            ))
                        }
                    },
                    Some(other) => {
                        return Err(ApiError::bad_field(
                            format!("content part type '{other}' is not supported (only input_text is)"),
                            Some(part_field()),
                        ))
                    }
                    None => return Err(ApiError::bad_field("a content part needs a 'type'", Some(part_field()))),
                }
            }
            text
        }
        _ => return Err(ApiError::bad_field("content must be a string or a list of parts", Some(field("content")))),
    };
    Ok(Some(message(role, text)))
}

fn message(role: &str, text: String) -> ChatMessage {
    ChatMessage::text(role, text)
}

/// The conversation a stored response ends: its input messages, then its answer as an
/// assistant message (reasoning is left out, as chat templates leave it out).
pub(crate) fn conversation_after(input: &[ChatMessage], response: &ResponseObject) -> Vec<ChatMessage> {
    let mut messages = input.to_vec();
    let answer: String = response
        .output
        .iter()
        .filter_map(|item| match item {
            OutputItem::Message { content, .. } => Some(content),
            OutputItem::Reasoning { .. } => None,
        })
        .flatten()
        .filter_map(|part| match part {
            ContentPart::OutputText { text, .. } => Some(text.as_str()),
            ContentPart::ReasoningText { .. } => None,
        })
        .collect();
    if !answer.is_empty() {
        messages.push(message("assistant", answer));
    }
    messages
}

/// The chat request that generates `request`'s response after `conversation` (the
/// earlier messages and this input; `instructions` go first as a system message).
pub(crate) fn chat_request(request: &CreateRequest, conversation: &[ChatMessage], default_max_tokens: u32) -> ChatCompletionRequest {
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = &request.instructions {
        messages.push(message("system", instructions.clone()));
    }
    messages.extend_from_slice(conversation);
    ChatCompletionRequest {
        model: request.model.clone(),
        messages,
        stream: true,
        max_tokens: Some(request.max_output_tokens.unwrap_or(default_max_tokens)),
        sampling: request.sampling.clone(),
        user: request.user.clone(),
        ..ChatCompletionRequest::default()
    }
}

/// The output a chat chunk adds, one delta per kind of text it carries.
pub(crate) fn deltas(chunk: &ChatCompletionChunk) -> Vec<Delta> {
    let mut out = Vec::new();
    for choice in &chunk.choices {
        if let Some(text) = &choice.delta.reasoning_content {
            out.push(Delta::Reasoning(text.clone()));
        }
        if let Some(text) = &choice.delta.content {
            out.push(Delta::Text(text.clone()));
        }
    }
    out
}

/// How a chat chunk ends generation, if it does.
pub(crate) fn ending(chunk: &ChatCompletionChunk) -> Option<Ending> {
    chunk.choices.iter().find_map(|c| c.finish_reason.as_deref()).map(|reason| match reason {
        "length" => Ending::Length,
        _ => Ending::Stopped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::MessageContent;
    use crate::http::request::parse_json;

    fn parse(json: &str) -> CreateRequest {
        parse_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn text_and_items_become_messages() {
        let r = parse(r#"{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":5,"temperature":0.5}"#);
        let conversation = input_messages(&r.input).unwrap();
        let chat = chat_request(&r, &conversation, 100);
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(chat.messages[1].content.as_ref().map(MessageContent::text).as_deref(), Some("hi"));
        assert_eq!(chat.max_tokens, Some(5));
        assert_eq!(chat.sampling.temperature, Some(0.5));

        let r = parse(
            r#"{"model":"m","input":[{"role":"developer","content":"sys"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
                {"type":"reasoning","id":"rs_1","summary":[]}]}"#,
        );
        let messages = input_messages(&r.input).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[0].role, "system");
        assert_eq!(messages[1].content.as_ref().map(MessageContent::text).as_deref(), Some("ab"));
        assert_eq!(chat_request(&r, &messages, 7).max_tokens, Some(7));
    }

    #[test]
    fn unsupported_input_is_named() {
        let r = parse(r#"{"model":"m","input":[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]}"#);
        let e = input_messages(&r.input).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.body.error.param.as_deref(), Some("input[0].content[0].type"));

        let r = parse(r#"{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":"x"}]}"#);
        assert_eq!(input_messages(&r.input).unwrap_err().body.error.param.as_deref(), Some("input[0].type"));

        let r = parse(r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f"}]}"#);
        assert_eq!(check_supported(&r).unwrap_err().body.error.param.as_deref(), Some("tools"));
        let r = parse(r#"{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}"#);
        assert_eq!(check_supported(&r).unwrap_err().body.error.param.as_deref(), Some("text.format"));
        let r = parse(r#"{"model":"m","input":"x","temperature":9}"#);
        assert!(check_supported(&r).unwrap_err().body.error.message.contains("temperature"));
        let r = parse(r#"{"model":"m","input":"x","tool_choice":"auto","tools":[],"text":{"format":{"type":"text"}}}"#);
        assert!(check_supported(&r).is_ok());
    }

    #[test]
    fn the_answer_continues_the_conversation() {
        let mut response = new_response("resp_1", "m", Status::Completed);
        response.output.push(OutputItem::Reasoning {
            id: "rs".into(),
            summary: vec![],
            content: vec![ContentPart::ReasoningText { text: "hidden".into() }],
            status: super::super::protocol::ItemStatus::Completed,
        });
        response.output.push(OutputItem::Message {
            id: "msg".into(),
            role: "assistant".into(),
            status: super::super::protocol::ItemStatus::Completed,
            content: vec![ContentPart::OutputText { text: "shown".into(), annotations: vec![], logprobs: vec![] }],
        });
        let messages = conversation_after(&[message("user", "q".into())], &response);
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1].role, "assistant");
        assert_eq!(messages[1].content.as_ref().map(MessageContent::text).as_deref(), Some("shown"));
    }

    #[test]
    fn a_chunk_with_reasoning_gives_a_reasoning_delta_before_its_text() {
        let chunk: ChatCompletionChunk = serde_json::from_str(
            r#"{"id":"c","object":"chat.completion.chunk","created":0,"model":"m",
                "choices":[{"index":0,"delta":{"reasoning_content":"think","content":"answer"}}]}"#,
        )
        .unwrap();
        assert_eq!(deltas(&chunk), vec![Delta::Reasoning("think".into()), Delta::Text("answer".into())]);
    }
}

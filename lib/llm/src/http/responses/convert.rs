//! Between the Responses API and our chat pipeline: a create request (with the stored
//! conversation it continues, see [`super::input`]) becomes a chat request; a chat chunk
//! becomes deltas for [`super::events::ResponseBuilder`]. Unsupported fields are refused
//! here, naming them.

use serde_json::Value;

use super::events::{Delta, Ending};
use super::protocol::{CreateRequest, ResponseObject, Status};
use super::tools::{chat_tool_choice, chat_tools, responses_error};
use crate::http::error::ApiError;
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, ChatMessage};
use crate::parsers::tool_calls::new_call_id;
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
        tool_choice: Value::from("none"),
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
        tools: request.tools.clone().unwrap_or_default(),
        tool_choice: request.tool_choice.clone().unwrap_or_else(|| {
            Value::from(if request.tools.as_ref().is_some_and(|t| !t.is_empty()) { "auto" } else { "none" })
        }),
        parallel_tool_calls: request.parallel_tool_calls.unwrap_or(true),
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

/// The chat request that generates `request`'s response after `conversation` (the
/// earlier messages and this input; `instructions` go first as a system message), with
/// its tools; checked as the chat path checks it, a 400 naming the Responses field.
pub(crate) fn chat_request(
    request: &CreateRequest,
    conversation: &[ChatMessage],
    default_max_tokens: u32,
) -> Result<ChatCompletionRequest, ApiError> {
    let mut messages = Vec::with_capacity(conversation.len() + 1);
    if let Some(instructions) = &request.instructions {
        messages.push(ChatMessage::text("system", instructions.clone()));
    }
    messages.extend_from_slice(conversation);
    let chat = ChatCompletionRequest {
        model: request.model.clone(),
        messages,
        stream: true,
        max_tokens: Some(request.max_output_tokens.unwrap_or(default_max_tokens)),
        sampling: request.sampling.clone(),
        user: request.user.clone(),
        tools: request.tools.as_deref().map(chat_tools).transpose()?,
        tool_choice: request.tool_choice.as_ref().map(chat_tool_choice).transpose()?,
        parallel_tool_calls: request.parallel_tool_calls,
        ..ChatCompletionRequest::default()
    };
    chat.validate().map_err(responses_error)?;
    Ok(chat)
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
        for call in choice.delta.tool_calls.iter().flatten() {
            out.push(Delta::Call {
                call_id: call.id.clone().unwrap_or_else(new_call_id),
                name: call.function.name.clone().unwrap_or_default(),
                arguments: call.function.arguments.clone().unwrap_or_default(),
            });
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
    use crate::http::request::parse_json;
    use crate::http::responses::input::input_messages;
    use crate::protocols::openai::MessageContent;

    fn parse(json: &str) -> CreateRequest {
        parse_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn instructions_and_limits_go_into_the_chat_request() {
        let r = parse(r#"{"model":"m","input":"hi","instructions":"be brief","max_output_tokens":5,"temperature":0.5}"#);
        let conversation = input_messages(&r.input).unwrap();
        let chat = chat_request(&r, &conversation, 100).unwrap();
        assert_eq!(chat.messages.len(), 2);
        assert_eq!(chat.messages[0].role, "system");
        assert_eq!(chat.messages[1].content.as_ref().map(MessageContent::text).as_deref(), Some("hi"));
        assert_eq!(chat.max_tokens, Some(5));
        assert_eq!(chat.sampling.temperature, Some(0.5));
        assert_eq!(chat.tools, None);
        let r = parse(r#"{"model":"m","input":"hi"}"#);
        assert_eq!(chat_request(&r, &conversation, 7).unwrap().max_tokens, Some(7));
    }

    #[test]
    fn tools_go_into_the_chat_request_and_are_checked_there() {
        let r = parse(
            r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}],
                "tool_choice":{"type":"function","name":"f"},"parallel_tool_calls":false}"#,
        );
        let chat = chat_request(&r, &input_messages(&r.input).unwrap(), 10).unwrap();
        assert_eq!(chat.tools.as_ref().unwrap()[0]["function"]["name"], "f");
        assert_eq!(chat.tool_choice.as_ref().unwrap()["function"]["name"], "f");
        assert_eq!(chat.parallel_tool_calls, Some(false));
        let response = response_for(&r, "resp_1");
        assert_eq!(response.tools, r.tools.clone().unwrap());
        assert_eq!(response.tool_choice["name"], "f");
        assert!(!response.parallel_tool_calls);

        let bad = |json: &str| {
            let r = parse(json);
            chat_request(&r, &input_messages(&r.input).unwrap(), 10).unwrap_err().body.error.param
        };
        assert_eq!(bad(r#"{"model":"m","input":"x","tools":[{"type":"function","description":"d"}]}"#).as_deref(),
            Some("tools[0].name"));
        assert_eq!(bad(r#"{"model":"m","input":"x","tools":[{"type":"function","name":"f"}],
            "tool_choice":{"type":"function","name":"g"}}"#).as_deref(), Some("tool_choice.name"));
        assert_eq!(bad(r#"{"model":"m","input":"x","tool_choice":"required"}"#).as_deref(), Some("tool_choice"));
        assert_eq!(bad(r#"{"model":"m","input":"x","tools":[{"type":"web_search"}]}"#).as_deref(), Some("tools[0].type"));
    }

    #[test]
    fn unsupported_fields_are_named() {
        let r = parse(r#"{"model":"m","input":"x","text":{"format":{"type":"json_object"}}}"#);
        assert_eq!(check_supported(&r).unwrap_err().body.error.param.as_deref(), Some("text.format"));
        let r = parse(r#"{"model":"m","input":"x","temperature":9}"#);
        assert!(check_supported(&r).unwrap_err().body.error.message.contains("temperature"));
        let r = parse(r#"{"model":"m","input":"x","tool_choice":"auto","tools":[],"text":{"format":{"type":"text"}}}"#);
        assert!(check_supported(&r).is_ok());
    }

    #[test]
    fn a_chunk_gives_reasoning_then_text_then_calls() {
        let chunk: ChatCompletionChunk = serde_json::from_str(
            r#"{"id":"c","object":"chat.completion.chunk","created":0,"model":"m",
                "choices":[{"index":0,"delta":{"reasoning_content":"think","content":"answer",
                "tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}"#,
        )
        .unwrap();
        assert_eq!(
            deltas(&chunk),
            vec![
                Delta::Reasoning("think".into()),
                Delta::Text("answer".into()),
                Delta::Call { call_id: "call_1".into(), name: "f".into(), arguments: "{}".into() }
            ]
        );
    }
}

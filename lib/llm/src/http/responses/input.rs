//! `input` items as the chat history a template expects: messages (text or a list of
//! text parts), `function_call` items as the assistant's `tool_calls`, and
//! `function_call_output` items as `tool` messages. A stored response's output goes
//! the same way when a follow-up names it in `previous_response_id`. What cannot be
//! served (images, files, other item types) is refused naming its place
//! (`input[2].content[0].type`).

use serde_json::{json, Value};

use super::protocol::{Input, OutputItem, ResponseObject};
use crate::http::error::ApiError;
use crate::protocols::openai::ChatMessage;

/// The messages of `input`, in order (`instructions` are not among them).
pub(crate) fn input_messages(input: &Input) -> Result<Vec<ChatMessage>, ApiError> {
    match input {
        Input::Text(text) => Ok(vec![ChatMessage::text("user", text.clone())]),
        Input::Items(items) => {
            let mut history = History::default();
            for (i, item) in items.iter().enumerate() {
                history.push(item, &format!("input[{i}]"))?;
            }
            Ok(history.messages)
        }
    }
}

/// The conversation a stored response ends: its input messages, then its output
/// (reasoning is left out, as chat templates leave it out; so are empty answers).
pub(crate) fn conversation_after(input: &[ChatMessage], response: &ResponseObject) -> Result<Vec<ChatMessage>, ApiError> {
    let mut history = History { messages: input.to_vec() };
    for (i, item) in response.output.iter().enumerate() {
        if matches!(item, OutputItem::Message { .. }) && item.content().iter().all(|p| p.text().is_empty()) {
            continue;
        }
        let value = serde_json::to_value(item).map_err(|e| ApiError::internal(format!("a stored output item: {e}")))?;
        history.push(&value, &format!("{}.output[{i}]", response.id))?;
    }
    Ok(history.messages)
}

/// Chat messages built item by item.
#[derive(Default)]
struct History {
    messages: Vec<ChatMessage>,
}

fn bad(message: impl Into<String>, param: String) -> ApiError {
    ApiError::bad_field(message, Some(param))
}

/// A string field of an item, required.
fn string_field<'a>(item: &'a Value, at: &str, name: &str) -> Result<&'a str, ApiError> {
    item.get(name).and_then(Value::as_str).ok_or_else(|| bad(format!("this item needs a string '{name}'"), format!("{at}.{name}")))
}

impl History {
    /// Add `item` (found at `at`, for errors).
    fn push(&mut self, item: &Value, at: &str) -> Result<(), ApiError> {
        match item.get("type").and_then(Value::as_str).unwrap_or("message") {
            "message" => {
                let message = message(item, at)?;
                self.messages.push(message);
            }
            "reasoning" => {}
            "function_call" => {
                let call = json!({
                    "id": string_field(item, at, "call_id")?,
                    "type": "function",
                    "function": {"name": string_field(item, at, "name")?, "arguments": string_field(item, at, "arguments")?},
                });
                self.push_call(call);
            }
            "function_call_output" => {
                let call_id = string_field(item, at, "call_id")?.to_string();
                let output = match item.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(parts)) => text_of_parts(parts, &format!("{at}.output"))?,
                    _ => return Err(bad("'output' must be a string or a list of input_text parts", format!("{at}.output"))),
                };
                let mut message = ChatMessage::text("tool", output);
                message.tool_call_id = Some(call_id);
                self.messages.push(message);
            }
            other => {
                return Err(bad(
                    format!(
                        "input item type '{other}' is not supported (only 'message', 'function_call', \
                         'function_call_output' and 'reasoning' items are)"
                    ),
                    format!("{at}.type"),
                ))
            }
        }
        Ok(())
    }

    /// A call joins the assistant message it follows (text and calls of one turn are
    /// one chat message), or starts one.
    fn push_call(&mut self, call: Value) {
        if let Some(last) = self.messages.last_mut().filter(|m| m.role == "assistant") {
            match last.tool_calls.as_mut().and_then(Value::as_array_mut) {
                Some(calls) => calls.push(call),
                None => last.tool_calls = Some(Value::Array(vec![call])),
            }
            return;
        }
        self.messages.push(ChatMessage {
            role: "assistant".to_string(),
            content: None,
            name: None,
            tool_calls: Some(Value::Array(vec![call])),
            tool_call_id: None,
        });
    }
}

/// A `message` item as a chat message (`developer` is the chat's `system`).
fn message(item: &Value, at: &str) -> Result<ChatMessage, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        Some("developer") => "system",
        Some(other) => {
            return Err(bad(format!("role must be user, assistant, system or developer, got '{other}'"), format!("{at}.role")))
        }
        None => return Err(bad("a message item needs a 'role'", format!("{at}.role"))),
    };
    let text = match item.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => text_of_parts(parts, &format!("{at}.content"))?,
        _ => return Err(bad("content must be a string or a list of parts", format!("{at}.content"))),
    };
    Ok(ChatMessage::text(role, text))
}

/// The text of content parts (`input_text`, and `output_text` in assistant history),
/// joined; an image or a file is a 400: the models served here take text only.
fn text_of_parts(parts: &[Value], at: &str) -> Result<String, ApiError> {
    let mut text = String::new();
    for (j, part) in parts.iter().enumerate() {
        let part_at = format!("{at}[{j}]");
        match part.get("type").and_then(Value::as_str) {
            Some("input_text" | "output_text" | "text") => match part.get("text").and_then(Value::as_str) {
                Some(t) => text.push_str(t),
                None => return Err(bad("a text part needs a string 'text'", format!("{part_at}.text"))),
            },
            Some(kind @ ("input_image" | "input_file" | "input_audio")) => {
                return Err(bad(
                    format!("'{kind}' content is not served: the models here take text input only"),
                    format!("{part_at}.type"),
                ))
            }
            Some(other) => {
                return Err(bad(
                    format!("content part type '{other}' is not supported (only input_text and output_text are)"),
                    format!("{part_at}.type"),
                ))
            }
            None => return Err(bad("a content part needs a 'type'", format!("{part_at}.type"))),
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::request::parse_json;
    use crate::http::responses::convert::new_response;
    use crate::http::responses::protocol::{ContentPart, CreateRequest, ItemStatus, Status};
    use crate::protocols::openai::MessageContent;

    fn items(json: &str) -> Result<Vec<ChatMessage>, ApiError> {
        let r: CreateRequest = parse_json(format!(r#"{{"model":"m","input":{json}}}"#).as_bytes()).unwrap();
        input_messages(&r.input)
    }

    fn text(m: &ChatMessage) -> Option<String> {
        m.content.as_ref().map(MessageContent::text)
    }

    #[test]
    fn messages_and_text_parts() {
        let messages = items(
            r#"[{"role":"developer","content":"sys"},
                {"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_text","text":"b"}]},
                {"type":"reasoning","id":"rs_1","summary":[]},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"c","annotations":[]}]}]"#,
        )
        .unwrap();
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[0].role, "system");
        assert_eq!(text(&messages[1]).as_deref(), Some("ab"));
        assert_eq!((messages[2].role.as_str(), text(&messages[2]).as_deref()), ("assistant", Some("c")));
    }

    #[test]
    fn calls_join_the_assistant_turn_and_outputs_are_tool_messages() {
        let messages = items(
            r#"[{"role":"user","content":"weather?"},
                {"type":"message","role":"assistant","content":[{"type":"output_text","text":"Let me check."}]},
                {"type":"function_call","call_id":"call_1","name":"get_weather","arguments":"{\"city\":\"Bern\"}"},
                {"type":"function_call","call_id":"call_2","name":"now","arguments":"{}"},
                {"type":"function_call_output","call_id":"call_1","output":"18C"},
                {"type":"function_call_output","call_id":"call_2","output":[{"type":"input_text","text":"noon"}]},
                {"type":"function_call","call_id":"call_3","name":"now","arguments":"{}"}]"#,
        )
        .unwrap();
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["user", "assistant", "tool", "tool", "assistant"]);
        assert_eq!(text(&messages[1]).as_deref(), Some("Let me check."));
        let calls = messages[1].tool_calls.as_ref().unwrap();
        assert_eq!(calls[0], json!({"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Bern\"}"}}));
        assert_eq!(calls[1]["id"], "call_2");
        assert_eq!((messages[2].tool_call_id.as_deref(), text(&messages[2]).as_deref()), (Some("call_1"), Some("18C")));
        assert_eq!(text(&messages[3]).as_deref(), Some("noon"));
        assert!(messages[4].content.is_none(), "a turn of calls only has no content");
        assert_eq!(messages[4].tool_calls.as_ref().unwrap()[0]["id"], "call_3");
    }

    #[test]
    fn what_cannot_be_served_is_named() {
        let param = |json: &str| items(json).unwrap_err().body.error.param;
        let e = items(r#"[{"role":"user","content":[{"type":"input_image","image_url":"x"}]}]"#).unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.body.error.param.as_deref(), Some("input[0].content[0].type"));
        assert!(e.body.error.message.contains("text input only"), "{}", e.body.error.message);
        assert_eq!(param(r#"[{"role":"user","content":[{"type":"input_file","file_id":"f"}]}]"#).as_deref(),
            Some("input[0].content[0].type"));
        assert_eq!(param(r#"[{"type":"item_reference","id":"x"}]"#).as_deref(), Some("input[0].type"));
        assert_eq!(param(r#"[{"type":"function_call","name":"f","arguments":"{}"}]"#).as_deref(), Some("input[0].call_id"));
        assert_eq!(param(r#"[{"type":"function_call_output","call_id":"c"}]"#).as_deref(), Some("input[0].output"));
        assert_eq!(param(r#"[{"role":"tool","content":"x"}]"#).as_deref(), Some("input[0].role"));
    }

    #[test]
    fn a_stored_answer_continues_the_conversation() {
        let mut response = new_response("resp_1", "m", Status::Completed);
        response.output.push(OutputItem::Reasoning {
            id: "rs".into(),
            summary: vec![],
            content: vec![ContentPart::ReasoningText { text: "hidden".into() }],
            status: ItemStatus::Completed,
        });
        response.output.push(OutputItem::Message {
            id: "msg".into(),
            role: "assistant".into(),
            status: ItemStatus::Completed,
            content: vec![ContentPart::OutputText { text: "shown".into(), annotations: vec![], logprobs: vec![] }],
        });
        response.output.push(OutputItem::FunctionCall {
            id: "fc".into(),
            call_id: "call_9".into(),
            name: "f".into(),
            arguments: "{}".into(),
            status: ItemStatus::Completed,
        });
        let messages = conversation_after(&[ChatMessage::text("user", "q".into())], &response).unwrap();
        assert_eq!(messages.len(), 2);
        assert_eq!(messages[1].role, "assistant");
        assert_eq!(text(&messages[1]).as_deref(), Some("shown"));
        assert_eq!(messages[1].tool_calls.as_ref().unwrap()[0]["id"], "call_9");

        let empty = new_response("resp_2", "m", Status::Completed);
        assert_eq!(conversation_after(&[ChatMessage::text("user", "q".into())], &empty).unwrap().len(), 1);
    }
}

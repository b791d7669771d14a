//! Function tools on `/v1/responses`: the API's flat tool shape (`{"type": "function",
//! "name", "description", "parameters", "strict"}`) and `tool_choice` become the chat
//! request's, so that the chat path checks them (`protocols::tools`) and its output
//! stage parses the calls; the chat path's errors come back naming the Responses field.

use serde_json::{json, Map, Value};

use crate::http::error::ApiError;

/// `tools` as the chat request has them (`{"type": "function", "function": {…}}`).
/// A tool of another type (the hosted ones: `web_search`, `file_search`, …) is a 400.
pub(crate) fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ApiError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let Some(fields) = tool.as_object() else {
                return Err(ApiError::bad_field(format!("tools[{i}]: expected an object"), Some(format!("tools[{i}]"))));
            };
            match fields.get("type").and_then(Value::as_str) {
                Some("function") => {}
                other => {
                    return Err(ApiError::bad_field(
                        format!(
                            "tools[{i}].type: only \"function\" tools are served here, got {}",
                            other.map_or("none".to_string(), |t| format!("{t:?}"))
                        ),
                        Some(format!("tools[{i}].type")),
                    ))
                }
            }
            let function: Map<String, Value> =
                fields.iter().filter(|(key, _)| key.as_str() != "type").map(|(k, v)| (k.clone(), v.clone())).collect();
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice` as the chat request has it: the strings as they are, `{"type":
/// "function", "name": …}` as `{"type": "function", "function": {"name": …}}`; the
/// hosted tools' and `allowed_tools` choices are a 400.
pub(crate) fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    let Some(fields) = choice.as_object() else { return Ok(choice.clone()) };
    match fields.get("type").and_then(Value::as_str) {
        Some("function") => {
            let function = match fields.get("name") {
                Some(name) => json!({"name": name}),
                None => json!({}),
            };
            Ok(json!({"type": "function", "function": function}))
        }
        other => Err(ApiError::bad_field(
            format!(
                "tool_choice.type: only \"function\" (or \"none\", \"auto\", \"required\") is served here, got {}",
                other.map_or("none".to_string(), |t| format!("{t:?}"))
            ),
            Some("tool_choice.type".to_string()),
        )),
    }
}

/// A chat validation error as a 400 of `/v1/responses`: a message that starts with a
/// chat field path (`tools[0].function.name: …`) is given the Responses path
/// (`tools[0].name: …`), which is also the error's `param`.
pub(crate) fn responses_error(message: String) -> ApiError {
    let Some((path, rest)) = message.split_once(": ") else { return ApiError::bad_request(message) };
    if !(path.starts_with("tools") || path.starts_with("tool_choice")) || path.contains(' ') {
        return ApiError::bad_request(message);
    }
    let path = path.replacen(".function.", ".", 1).replacen(".function", "", 1);
    ApiError::bad_field(format!("{path}: {rest}"), Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flat_tools_and_choices_take_the_chat_shape() {
        let tools = [json!({"type": "function", "name": "f", "description": "d", "strict": true,
            "parameters": {"type": "object"}})];
        assert_eq!(
            chat_tools(&tools).unwrap(),
            [json!({"type": "function", "function": {"name": "f", "description": "d", "strict": true,
                "parameters": {"type": "object"}}})]
        );
        assert_eq!(chat_tool_choice(&json!("required")).unwrap(), json!("required"));
        assert_eq!(
            chat_tool_choice(&json!({"type": "function", "name": "f"})).unwrap(),
            json!({"type": "function", "function": {"name": "f"}})
        );
    }

    #[test]
    fn hosted_tools_and_chat_errors_name_the_responses_field() {
        let e = chat_tools(&[json!({"type": "function", "name": "f"}), json!({"type": "web_search"})]).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("tools[1].type"));
        let e = chat_tool_choice(&json!({"type": "file_search"})).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("tool_choice.type"));

        let e = responses_error("tools[2].function.name: every tool needs a name".to_string());
        assert_eq!(e.body.error.param.as_deref(), Some("tools[2].name"));
        assert_eq!(e.body.error.message, "tools[2].name: every tool needs a name");
        let e = responses_error("tools[0].function: expected an object with the function's name".to_string());
        assert_eq!(e.body.error.param.as_deref(), Some("tools[0]"));
        let e = responses_error("tool_choice.function.name: \"g\" is not among the request's tools".to_string());
        assert_eq!(e.body.error.param.as_deref(), Some("tool_choice.name"));
        let e = responses_error("temperature must be between 0 and 2".to_string());
        assert_eq!(e.body.error.param, None);
    }
}

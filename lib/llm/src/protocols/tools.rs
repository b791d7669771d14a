//! Tool calling in a chat request: the functions a client offers (`tools`), which of
//! them the model may or must call (`tool_choice`), their checks (a 400 naming the
//! field), and the JSON-schema constraint that `required` and named choices become.

use serde_json::{json, Map, Value};

use super::openai::ChatCompletionRequest;

/// `tool_choice`, resolved: OpenAI's default is `auto` with tools and `none` without.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the template renders no tools and the output is not parsed for calls.
    None,
    /// The model decides; its output is parsed with the model's tool-call parser.
    Auto,
    /// At least one call, guaranteed by a JSON-schema constraint.
    Required,
    /// A call of this function, guaranteed by a JSON-schema constraint.
    Named(String),
}

/// One function a client offers, as checked.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionTool {
    /// The function's name.
    pub name: String,
    /// Its parameters' JSON schema (an object), when given.
    pub parameters: Option<Value>,
}

/// The tool part of a chat request, checked: the offered functions and the choice.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The offered functions, in the request's order.
    pub tools: Vec<FunctionTool>,
    /// What the model may or must do with them.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): whether more than one call is allowed.
    pub parallel: bool,
}

impl ToolRequest {
    /// The request's tools and choice, checked; `None` when it offers no tools. The
    /// error is a client error (400) naming the field.
    pub fn from_request(request: &ChatCompletionRequest) -> Result<Option<ToolRequest>, String> {
        let tools = match request.tools.as_deref() {
            Some(tools) if !tools.is_empty() => function_tools(tools)?,
            _ => Vec::new(),
        };
        let choice = match request.tool_choice.as_ref() {
            None | Some(Value::Null) => {
                if tools.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            Some(value) => parse_choice(value)?,
        };
        if tools.is_empty() {
            return match choice {
                ToolChoice::None | ToolChoice::Auto => Ok(None),
                _ => Err("tool_choice: `required` or a named function needs `tools`".to_string()),
            };
        }
        if let ToolChoice::Named(name) = &choice {
            if !tools.iter().any(|t| &t.name == name) {
                return Err(format!("tool_choice.function.name: {name:?} is not among the request's tools"));
            }
        }
        Ok(Some(ToolRequest { tools, choice, parallel: request.parallel_tool_calls.unwrap_or(true) }))
    }

    /// The names of the offered functions (a call of any other is content).
    pub fn names(&self) -> Vec<String> {
        self.tools.iter().map(|t| t.name.clone()).collect()
    }

    /// Whether the model's output is parsed for calls with the model's tool-call parser.
    pub fn parses_with_model_parser(&self) -> bool {
        self.choice == ToolChoice::Auto
    }

    /// The JSON schema the engine must generate for `required` (an array of at least
    /// one `{"name", "parameters"}` object, at most one without `parallel_tool_calls`;
    /// the tools' `$defs` moved to the top, where their `#/$defs/…` references point)
    /// or a named choice (that function's parameters); `None` otherwise.
    pub fn constraint(&self) -> Option<Value> {
        match &self.choice {
            ToolChoice::Named(name) => {
                let tool = self.tools.iter().find(|t| &t.name == name)?;
                Some(parameters_or_any_object(tool.parameters.as_ref()))
            }
            ToolChoice::Required => {
                let mut defs = Map::new();
                let calls: Vec<Value> = self
                    .tools
                    .iter()
                    .map(|t| {
                        let mut parameters = parameters_or_any_object(t.parameters.as_ref());
                        if let Some(Value::Object(own)) = parameters.as_object_mut().and_then(|p| p.remove("$defs")) {
                            defs.extend(own);
                        }
                        json!({
                            "type": "object",
                            "properties": {
                                "name": {"type": "string", "enum": [t.name]},
                                "parameters": parameters,
                            },
                            "required": ["name", "parameters"],
                            "additionalProperties": false,
                        })
                    })
                    .collect();
                let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": calls}});
                if !self.parallel {
                    schema["maxItems"] = json!(1);
                }
                if !defs.is_empty() {
                    schema["$defs"] = Value::Object(defs);
                }
                Some(schema)
            }
            ToolChoice::None | ToolChoice::Auto => None,
        }
    }
}

/// A function's parameters schema, or any object when it has none (arguments are
/// always a JSON object).
fn parameters_or_any_object(parameters: Option<&Value>) -> Value {
    match parameters {
        Some(Value::Object(map)) if !map.is_empty() => Value::Object(map.clone()),
        _ => json!({"type": "object", "properties": {}}),
    }
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type": "function", "function": {"name": …}}`.
fn parse_choice(value: &Value) -> Result<ToolChoice, String> {
    match value {
        Value::String(s) => match s.as_str() {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => Err(format!("tool_choice: expected \"none\", \"auto\", \"required\" or a named function, got {other:?}")),
        },
        Value::Object(map) => {
            if map.get("type").is_some_and(|t| t != "function") {
                return Err("tool_choice.type: only \"function\" is supported".to_string());
            }
            match map.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
                Some(name) if !name.is_empty() => Ok(ToolChoice::Named(name.to_string())),
                _ => Err("tool_choice.function.name: a named tool choice needs the function's name".to_string()),
            }
        }
        _ => Err("tool_choice: expected a string or {\"type\": \"function\", \"function\": {\"name\": …}}".to_string()),
    }
}

/// Check each entry of `tools`: `{"type": "function", "function": {"name": …,
/// "parameters": {JSON schema}}}` with distinct names.
fn function_tools(tools: &[Value]) -> Result<Vec<FunctionTool>, String> {
    let mut out: Vec<FunctionTool> = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let tool = tool.as_object().ok_or_else(|| format!("tools[{i}]: expected an object"))?;
        if tool.get("type").is_some_and(|t| t != "function") {
            return Err(format!("tools[{i}].type: only \"function\" tools are supported"));
        }
        let function: &Map<String, Value> = tool
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("tools[{i}].function: expected an object with the function's name"))?;
        let name = match function.get("name").and_then(Value::as_str) {
            Some(name) if !name.trim().is_empty() => name.to_string(),
            _ => return Err(format!("tools[{i}].function.name: every tool needs a name")),
        };
        if out.iter().any(|t| t.name == name) {
            return Err(format!("tools[{i}].function.name: {name:?} is offered twice"));
        }
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => None,
            Some(schema @ Value::Object(map)) => {
                if map.get("type").is_some_and(|t| !t.is_string() && !t.is_array()) {
                    return Err(format!("tools[{i}].function.parameters.type: not a JSON schema type"));
                }
                Some(schema.clone())
            }
            Some(_) => return Err(format!("tools[{i}].function.parameters: expected a JSON schema object")),
        };
        if let Some(defs) = parameters.as_ref().and_then(|p| p.get("$defs")) {
            let Some(defs) = defs.as_object() else {
                return Err(format!("tools[{i}].function.parameters.$defs: expected an object"));
            };
            for (key, schema) in defs {
                let clash = out.iter().filter_map(|t| t.parameters.as_ref()?.get("$defs")?.get(key)).any(|s| s != schema);
                if clash {
                    return Err(format!("tools[{i}].function.parameters.$defs.{key}: defined differently by another tool"));
                }
            }
        }
        out.push(FunctionTool { name, parameters });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(fields: &str) -> ChatCompletionRequest {
        serde_json::from_str(&format!(r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}]{fields}}}"#)).unwrap()
    }

    const WEATHER: &str = r#","tools":[{"type":"function","function":{"name":"get_weather",
        "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}},
        {"type":"function","function":{"name":"now"}}]"#;

    #[test]
    fn the_choice_defaults_to_auto_with_tools_and_to_nothing_without() {
        assert_eq!(ToolRequest::from_request(&request("")).unwrap(), None);
        assert_eq!(ToolRequest::from_request(&request(r#","tool_choice":"none""#)).unwrap(), None);
        let t = ToolRequest::from_request(&request(WEATHER)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Auto);
        assert_eq!(t.names(), vec!["get_weather", "now"]);
        assert!(t.parallel);
        assert_eq!(t.constraint(), None);
        let t = ToolRequest::from_request(&request(&format!(r#"{WEATHER},"tool_choice":"none""#))).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::None);
    }

    #[test]
    fn bad_tools_and_choices_name_the_field() {
        let cases = [
            (r#","tools":[{"type":"function","function":{"description":"d"}}]"#, "tools[0].function.name"),
            (r#","tools":[{"type":"function","function":{"name":""}}]"#, "tools[0].function.name"),
            (r#","tools":[{"type":"function","function":{"name":"f","parameters":"object"}}]"#, "tools[0].function.parameters"),
            (r#","tools":[{"type":"function","function":{"name":"f","parameters":{"type":3}}}]"#, "tools[0].function.parameters.type"),
            (r#","tools":[{"type":"retrieval"}]"#, "tools[0].type"),
            (r#","tools":[{"function":{"name":"f"}},{"function":{"name":"f"}}]"#, "tools[1].function.name"),
            (r#","tools":[{"function":{"name":"f"}}],"tool_choice":"sometimes""#, "tool_choice"),
            (r#","tools":[{"function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}"#, "tool_choice.function.name"),
            (r#","tools":[{"function":{"name":"f"}}],"tool_choice":{"type":"function","function":{}}"#, "tool_choice.function.name"),
            (r#","tool_choice":"required""#, "tool_choice"),
        ];
        for (fields, field) in cases {
            let e = ToolRequest::from_request(&request(fields)).unwrap_err();
            assert!(e.starts_with(&format!("{field}:")), "{fields}: {e}");
        }
    }

    #[test]
    fn required_is_an_array_of_calls_and_named_is_the_functions_parameters() {
        let t = ToolRequest::from_request(&request(&format!(r#"{WEATHER},"tool_choice":"required""#))).unwrap().unwrap();
        let schema = t.constraint().unwrap();
        assert_eq!(schema["type"], "array");
        assert_eq!(schema["minItems"], 1);
        assert!(schema.get("maxItems").is_none());
        let calls = schema["items"]["anyOf"].as_array().unwrap();
        assert_eq!(calls[0]["properties"]["name"]["enum"], json!(["get_weather"]));
        assert_eq!(calls[0]["properties"]["parameters"]["required"], json!(["city"]));
        assert_eq!(calls[1]["properties"]["parameters"], json!({"type": "object", "properties": {}}));

        let defs = r##","tool_choice":"required","tools":[{"function":{"name":"f","parameters":{"type":"object",
            "properties":{"p":{"$ref":"#/$defs/P"}},"$defs":{"P":{"type":"integer"}}}}}]"##;
        let schema = ToolRequest::from_request(&request(defs)).unwrap().unwrap().constraint().unwrap();
        assert_eq!(schema["$defs"], json!({"P": {"type": "integer"}}));
        assert!(schema["items"]["anyOf"][0]["properties"]["parameters"].get("$defs").is_none());
        let clash = r#","tools":[{"function":{"name":"f","parameters":{"$defs":{"P":{"type":"integer"}}}}},
            {"function":{"name":"g","parameters":{"$defs":{"P":{"type":"string"}}}}}]"#;
        assert!(ToolRequest::from_request(&request(clash)).unwrap_err().starts_with("tools[1].function.parameters.$defs.P:"));

        let t = ToolRequest::from_request(&request(&format!(r#"{WEATHER},"tool_choice":"required","parallel_tool_calls":false"#)))
            .unwrap()
            .unwrap();
        assert_eq!(t.constraint().unwrap()["maxItems"], 1);

        let named = format!(r#"{WEATHER},"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}"#);
        let t = ToolRequest::from_request(&request(&named)).unwrap().unwrap();
        assert_eq!(t.choice, ToolChoice::Named("get_weather".into()));
        assert_eq!(t.constraint().unwrap()["properties"]["city"]["type"], "string");
        assert!(!t.parses_with_model_parser());
    }
}

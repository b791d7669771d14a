//! Chat template rendering with minijinja, set up to behave like HuggingFace's
//! `apply_chat_template`: `trim_blocks` + `lstrip_blocks`, Python string/dict methods
//! (`.strip()`, `.items()` … via minijinja-contrib's pycompat), `raise_exception`,
//! transformers' `tojson` ([`super::tojson`]) and `strftime_now`; the tools and
//! messages reach the template as vLLM's server gives them to it, so the prompt is the
//! one vLLM renders for the same request.

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde_json::Map;

use super::tojson::tojson;

use crate::model_card::ModelDeploymentCard;
use crate::protocols::openai::{ChatMessage, MessageContent};

const DEFAULT: &str = "default";
const TOOL_USE: &str = "tool_use";

/// The template used when a card has none: `<|role|>\ncontent\n` per message.
const FALLBACK_TEMPLATE: &str =
    "{% for message in messages %}<|{{ message.role }}|>\n{{ message.content }}\n{% endfor %}\
{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// A template failed to compile or render.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("chat template: {0}")]
pub struct TemplateError(pub String);

impl From<Error> for TemplateError {
    fn from(e: Error) -> Self {
        let message = match e.detail() {
            Some(detail) => detail.to_string(),
            None => e.kind().to_string(),
        };
        match e.line() {
            Some(line) => TemplateError(format!("{message} (line {line})")),
            None => TemplateError(message),
        }
    }
}

/// A compiled chat template (and its `tool_use` variant, if the model has one).
pub struct PromptFormatter {
    env: Environment<'static>,
    has_tool_template: bool,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for PromptFormatter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PromptFormatter").field("has_tool_template", &self.has_tool_template).finish()
    }
}

impl PromptFormatter {
    /// Compile `template` (and `tool_use_template`); a syntax error is reported here.
    pub fn new(
        template: &str,
        tool_use_template: Option<&str>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(DEFAULT, template.to_string())?;
        if let Some(tool) = tool_use_template {
            env.add_template_owned(TOOL_USE, tool.to_string())?;
        }
        Ok(PromptFormatter { env, has_tool_template: tool_use_template.is_some(), bos_token, eos_token })
    }

    /// The card's templates, or a plain `<|role|>` template when it has none.
    pub fn from_card(card: &ModelDeploymentCard) -> Result<Self, TemplateError> {
        PromptFormatter::new(
            card.chat_template.as_deref().unwrap_or(FALLBACK_TEMPLATE),
            card.tool_use_template.as_deref(),
            card.bos_token.clone(),
            card.eos_token.clone(),
        )
    }

    /// Render `messages`. `add_generation_prompt` is true unless the last message is
    /// the assistant's (the model then continues it). With tools, the `tool_use`
    /// template is used when there is one.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
    ) -> Result<String, TemplateError> {
        self.render_with(messages, tools, None)
    }

    /// [`Self::render`] with extra template variables (a request's
    /// `chat_template_kwargs`, as HF's `apply_chat_template(**kwargs)` passes them);
    /// the variables above win over them.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        kwargs: Option<&serde_json::Map<String, serde_json::Value>>,
    ) -> Result<String, TemplateError> {
        let add_generation_prompt = messages.last().is_none_or(|m| m.role != "assistant");
        let tools = tools.filter(|t| !t.is_empty());
        let name = if tools.is_some() && self.has_tool_template { TOOL_USE } else { DEFAULT };
        let mut ctx = kwargs.cloned().unwrap_or_default();
        ctx.insert("messages".into(), messages.iter().map(message_value).collect());
        ctx.insert("tools".into(), tools.map_or(serde_json::Value::Null, |t| t.iter().map(tool_value).collect()));
        ctx.insert("bos_token".into(), self.bos_token.as_deref().unwrap_or("").into());
        ctx.insert("eos_token".into(), self.eos_token.as_deref().unwrap_or("").into());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        Ok(self.env.get_template(name)?.render(ctx)?)
    }
}

/// A tool as vLLM's server gives it to the template (`tool.model_dump()` of its
/// `ChatCompletionToolsParam`): `type` and `function` with `name`, `description` and
/// `parameters` (`null` when not sent), then `strict` and `defer_loading` only when
/// sent (a tool's own `defer_loading` is also its function's); other fields dropped.
fn tool_value(tool: &serde_json::Value) -> serde_json::Value {
    let Some(tool) = tool.as_object() else { return tool.clone() };
    let given = |map: Option<&Map<String, serde_json::Value>>, key: &str| {
        map.and_then(|m| m.get(key)).filter(|v| !v.is_null()).cloned()
    };
    let function = tool.get("function").and_then(serde_json::Value::as_object);
    let defer_loading = given(Some(tool), "defer_loading");
    let mut f = Map::new();
    for key in ["name", "description", "parameters"] {
        f.insert(key.into(), given(function, key).unwrap_or_default());
    }
    if let Some(strict) = given(function, "strict") {
        f.insert("strict".into(), strict);
    }
    if let Some(defer) = given(function, "defer_loading").or_else(|| defer_loading.clone()) {
        f.insert("defer_loading".into(), defer);
    }
    let mut t = Map::new();
    t.insert("type".into(), given(Some(tool), "type").unwrap_or_else(|| "function".into()));
    t.insert("function".into(), f.into());
    if let Some(defer) = defer_loading {
        t.insert("defer_loading".into(), defer);
    }
    t.into()
}

/// A message as vLLM's server gives it to a template that takes text content:
/// `content` a string (text parts joined by newlines; empty when not sent), then
/// `tool_calls` (an assistant's) or `tool_call_id` (a tool result's), then `name`.
fn message_value(m: &ChatMessage) -> serde_json::Value {
    let mut v = Map::new();
    v.insert("role".into(), m.role.clone().into());
    let content = match &m.content {
        Some(MessageContent::Text(text)) => text.clone(),
        Some(MessageContent::Parts(parts)) => parts.iter().filter_map(|p| p.text.as_deref()).collect::<Vec<_>>().join("\n"),
        None => String::new(),
    };
    v.insert("content".into(), content.into());
    if let Some(calls) = &m.tool_calls {
        v.insert("tool_calls".into(), calls_as_templates_take_them(calls));
    }
    if let Some(id) = &m.tool_call_id {
        v.insert("tool_call_id".into(), id.clone().into());
    }
    if let Some(name) = &m.name {
        v.insert("name".into(), name.clone().into());
    }
    serde_json::Value::Object(v)
}

/// An assistant message's `tool_calls` as vLLM passes them: each call's `id`,
/// `function` (`arguments`, `name`) and `type`, in that order (the fields of OpenAI's
/// typed call), with the `arguments` JSON string parsed into its value: templates
/// write arguments with `tojson` and expect a mapping (HF's convention). Text that is
/// not JSON stays a string.
fn calls_as_templates_take_them(calls: &serde_json::Value) -> serde_json::Value {
    let Some(list) = calls.as_array() else { return calls.clone() };
    let pick = |from: &serde_json::Value, keys: &[&str]| -> Map<String, serde_json::Value> {
        keys.iter().filter_map(|k| Some(((*k).to_string(), from.get(*k)?.clone()))).collect()
    };
    let calls = list.iter().map(|call| {
        if !call.is_object() {
            return call.clone();
        }
        let mut out = pick(call, &["id", "function", "type"]);
        if let Some(function) = out.get_mut("function").filter(|f| f.is_object()) {
            let mut f = pick(function, &["arguments", "name"]);
            if let Some(arguments) = f.get_mut("arguments") {
                if let Some(parsed) = arguments.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                    *arguments = parsed;
                }
            }
            *function = f.into();
        }
        out.into()
    });
    calls.collect()
}

/// `raise_exception(msg)`: templates use it to reject conversations they cannot format.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// `strftime_now(format)`: the local time, formatted like Python's `strftime`.
fn strftime_now(format: String) -> Result<Value, Error> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|i| matches!(i, Item::Error)) {
        return Err(Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")));
    }
    Ok(Value::from(chrono::Local::now().format_with_items(items.into_iter()).to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_calls: None,
            tool_call_id: None,
        }
    }

    const ZEPHYR: &str = "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}";

    #[test]
    fn renders_with_generation_prompt_and_trimmed_blocks() {
        let f = PromptFormatter::new(ZEPHYR, None, Some("<s>".into()), Some("</s>".into())).unwrap();
        let out = f.render(&[msg("user", "hi")], None).unwrap();
        assert_eq!(out, "<|user|>\nhi</s>\n<|assistant|>\n");
        // A trailing assistant message is continued, not followed by a new prompt.
        let out = f.render(&[msg("user", "hi"), msg("assistant", "yo")], None).unwrap();
        assert_eq!(out, "<|user|>\nhi</s>\n<|assistant|>\nyo</s>\n");
    }

    #[test]
    fn raise_exception_is_a_clear_error() {
        let t = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with a user message') }}{% endif %}ok";
        let f = PromptFormatter::new(t, None, None, None).unwrap();
        let e = f.render(&[msg("system", "s")], None).unwrap_err();
        assert!(e.to_string().contains("Conversation must start with a user message"), "{e}");
        assert_eq!(f.render(&[msg("user", "u")], None).unwrap(), "ok");
    }

    #[test]
    fn python_methods_and_tojson_keep_the_clients_key_order() {
        let t = "{{ messages[0].content.strip() }}|{% for k, v in x.items() %}{{ k }}={{ v | tojson }};{% endfor %}|{{ x | tojson }}";
        let f = PromptFormatter::new(t, None, None, None).unwrap();
        let kwargs = serde_json::json!({"x": {"name": "f<x>", "args": [1, 2]}});
        let out = f.render_with(&[msg("user", "  padded  ")], None, kwargs.as_object()).unwrap();
        assert_eq!(out, r#"padded|name="f<x>";args=[1, 2];|{"name": "f<x>", "args": [1, 2]}"#);
    }

    #[test]
    fn tool_use_template_is_chosen_with_tools() {
        let f = PromptFormatter::new("plain", Some("tools:{{ tools | length }}"), None, None).unwrap();
        assert_eq!(f.render(&[msg("user", "u")], None).unwrap(), "plain");
        assert_eq!(f.render(&[msg("user", "u")], Some(&[serde_json::json!({})])).unwrap(), "tools:1");
    }

    /// A small Hermes-style template, written as real tool templates are: the tools with
    /// `tojson`, assistant calls with their arguments as a mapping, tool results.
    const TOOL_TEMPLATE: &str = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n{% endif %}\
{% for m in messages %}<|{{ m.role }}|>{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}\
{% elif m.role == 'tool' %}<tool_response id={{ m.tool_call_id }}>{{ m.content }}</tool_response>{% else %}{{ m.content }}{% endif %}\n{% endfor %}\
{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}{% endif %}";

    #[test]
    fn tools_calls_and_tool_results_reach_the_template_as_hf_passes_them() {
        let f = PromptFormatter::new(TOOL_TEMPLATE, None, None, None).unwrap();
        let tools = vec![serde_json::json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}})];
        let assistant: ChatMessage = serde_json::from_value(serde_json::json!({"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}))
        .unwrap();
        let tool: ChatMessage =
            serde_json::from_value(serde_json::json!({"role": "tool", "tool_call_id": "call_1", "content": "18C"})).unwrap();
        let messages = [msg("user", "weather?"), assistant, tool];
        let out = f.render(&messages, Some(&tools)).unwrap();
        // The tool as vLLM's server dumps it (a `null` description), keys in the
        // client's order.
        assert_eq!(
            out,
            "<tools>{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": null, \
\"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}}}\n</tools>\n<|user|>weather?\
<|assistant|><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\
<|tool|><tool_response id=call_1>18C</tool_response><|assistant|>"
        );
        // No tools: nothing rendered for them; template kwargs reach the template.
        let kwargs = serde_json::json!({"enable_thinking": false});
        let out = f.render_with(&[msg("user", "hi")], None, kwargs.as_object()).unwrap();
        assert_eq!(out, "<|user|>hi<|assistant|><think></think>");
    }

    #[test]
    fn tools_are_dumped_as_vllm_dumps_them() {
        let tool = serde_json::json!({"function": {"strict": true, "parameters": {"type": "object"}, "name": "f",
            "extra": 1}, "type": "function", "defer_loading": false});
        assert_eq!(
            serde_json::to_string(&tool_value(&tool)).unwrap(),
            r#"{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"},"strict":true,"defer_loading":false},"defer_loading":false}"#
        );
        let bare = serde_json::json!({"function": {"name": "g"}});
        assert_eq!(
            serde_json::to_string(&tool_value(&bare)).unwrap(),
            r#"{"type":"function","function":{"name":"g","description":null,"parameters":null}}"#
        );
    }

    #[test]
    fn messages_reach_the_template_as_vllm_gives_them() {
        let m: ChatMessage = serde_json::from_value(serde_json::json!({"role": "assistant", "name": "a",
            "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"b\": 1, \"a\": 2}"},
                "id": "call_1", "extra": 0}]}))
        .unwrap();
        assert_eq!(
            serde_json::to_string(&message_value(&m)).unwrap(),
            r#"{"role":"assistant","content":"","tool_calls":[{"id":"call_1","function":{"arguments":{"b":1,"a":2},"name":"f"},"type":"function"}],"name":"a"}"#
        );
        let parts: ChatMessage = serde_json::from_value(serde_json::json!({"role": "user",
            "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}))
        .unwrap();
        assert_eq!(message_value(&parts)["content"], "one\ntwo");
    }

    #[test]
    fn strftime_now_formats_and_rejects_bad_formats() {
        let f = PromptFormatter::new("{{ strftime_now('%Y') }}", None, None, None).unwrap();
        let year = f.render(&[], None).unwrap();
        assert_eq!(year.len(), 4);
        assert!(year.chars().all(|c| c.is_ascii_digit()));
        let f = PromptFormatter::new("{{ strftime_now('%Q') }}", None, None, None).unwrap();
        assert!(f.render(&[], None).is_err());
    }

    #[test]
    fn syntax_error_is_reported_at_load() {
        assert!(PromptFormatter::new("{% for %}", None, None, None).is_err());
    }
}

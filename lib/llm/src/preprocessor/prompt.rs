//! Chat template rendering with minijinja, set up to behave like HuggingFace's
//! `apply_chat_template`: `trim_blocks` + `lstrip_blocks`, Python string/dict methods
//! (`.strip()`, `.items()` … via minijinja-contrib's pycompat), `raise_exception`,
//! a `tojson` that writes JSON the way Python's `json.dumps` does, and `strftime_now`.

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::model_card::ModelDeploymentCard;
use crate::protocols::openai::ChatMessage;

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
        ctx.insert("tools".into(), tools.map_or(serde_json::Value::Null, |t| t.to_vec().into()));
        ctx.insert("bos_token".into(), self.bos_token.as_deref().unwrap_or("").into());
        ctx.insert("eos_token".into(), self.eos_token.as_deref().unwrap_or("").into());
        ctx.insert("add_generation_prompt".into(), add_generation_prompt.into());
        Ok(self.env.get_template(name)?.render(ctx)?)
    }
}

/// A message as templates see it: `content` is a string (text parts joined), `null`
/// only for an assistant message that carries tool calls instead.
fn message_value(m: &ChatMessage) -> serde_json::Value {
    let mut v = serde_json::Map::new();
    v.insert("role".into(), m.role.clone().into());
    let content = match (&m.content, &m.tool_calls) {
        (Some(c), _) => c.text().into(),
        (None, Some(_)) => serde_json::Value::Null,
        (None, None) => "".into(),
    };
    v.insert("content".into(), content);
    if let Some(name) = &m.name {
        v.insert("name".into(), name.clone().into());
    }
    if let Some(calls) = &m.tool_calls {
        v.insert("tool_calls".into(), calls_with_object_arguments(calls));
    }
    if let Some(id) = &m.tool_call_id {
        v.insert("tool_call_id".into(), id.clone().into());
    }
    serde_json::Value::Object(v)
}

/// An assistant message's `tool_calls` with each `function.arguments` JSON string
/// parsed into its value: templates write arguments with `tojson` and expect a
/// mapping (HF's convention; vLLM converts them the same way). Text that is not JSON
/// stays a string.
fn calls_with_object_arguments(calls: &serde_json::Value) -> serde_json::Value {
    let mut calls = calls.clone();
    if let Some(list) = calls.as_array_mut() {
        for call in list {
            if let Some(arguments) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) {
                if let Some(parsed) = arguments.as_str().and_then(|s| serde_json::from_str(s).ok()) {
                    *arguments = parsed;
                }
            }
        }
    }
    calls
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

/// `tojson(indent=None)`: JSON as Python's `json.dumps(..., ensure_ascii=False)`
/// writes it (`", "` and `": "` separators; no HTML escaping), which is what HF
/// templates were written against. Other keyword arguments are accepted and ignored.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let mut out = Vec::new();
    let result = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            let mut ser =
                serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad));
            value.serialize(&mut ser)
        }
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter)),
    };
    result.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let text = String::from_utf8(out).map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(Value::from_safe_string(text))
}

/// Compact JSON with Python's default separators.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::MessageContent;

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
    fn python_methods_and_tojson() {
        let t = "{{ messages[0].content.strip() }}|{% for k, v in tools[0].items() %}{{ k }}={{ v | tojson }};{% endfor %}|{{ tools | tojson }}";
        let f = PromptFormatter::new(t, None, None, None).unwrap();
        let tools = vec![serde_json::json!({"name": "f<x>", "args": [1, 2]})];
        let out = f.render(&[msg("user", "  padded  ")], Some(&tools)).unwrap();
        assert_eq!(out, r#"padded|args=[1, 2];name="f<x>";|[{"args": [1, 2], "name": "f<x>"}]"#);
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
        // serde_json keeps object keys sorted (its `preserve_order` feature is off), so
        // `tojson` writes them sorted where Python keeps the client's order.
        assert_eq!(
            out,
            "<tools>{\"function\": {\"name\": \"get_weather\", \"parameters\": {\"properties\": {\"city\": {\"type\": \
\"string\"}}, \"type\": \"object\"}}, \"type\": \"function\"}\n</tools>\n<|user|>weather?\
<|assistant|><tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>\
<|tool|><tool_response id=call_1>18C</tool_response><|assistant|>"
        );
        // No tools: nothing rendered for them; template kwargs reach the template.
        let kwargs = serde_json::json!({"enable_thinking": false});
        let out = f.render_with(&[msg("user", "hi")], None, kwargs.as_object()).unwrap();
        assert_eq!(out, "<|user|>hi<|assistant|><think></think>");
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

//! Tool-call parsers: one [`ToolCallParser`] per output format, found by vLLM's
//! `--tool-call-parser` names through [`tool_call_parser`].
//!
//! A parser sees each detokenized delta once and keeps its own state. A call is
//! emitted whole (index, id, name and arguments in one [`ToolCallDelta`]) when its
//! closing markup arrives and it has been checked: valid JSON (or Python literals for
//! `pythonic`), a name among the request's tools. Anything that fails the check comes
//! back as plain content. Text before a call is content; markup never is.

mod balance;
mod call_json;
mod content;
mod deepseek_v3;
mod emit;
mod hermes;
mod llama3_json;
mod mistral;
mod python_literal;
mod pythonic;

use super::error::{ParserKind, UnknownParser};

pub(crate) use emit::new_call_id;

/// The registered tool-call parser names (vLLM's spelling).
pub const TOOL_CALL_PARSERS: &[&str] = &["deepseek_v3", "hermes", "llama3_json", "mistral", "pythonic"];

/// One tool call in a stream, in OpenAI's delta shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallDelta {
    /// The call's position among this response's calls, from 0.
    pub index: usize,
    /// `call_` and 24 hex digits; set on the first delta of a call.
    pub id: Option<String>,
    /// The function's name; set on the first delta of a call.
    pub name: Option<String>,
    /// A piece of the arguments (a JSON object's text, as the model wrote it).
    pub arguments: String,
}

/// What one [`ToolCallParser::push`] or [`ToolCallParser::finish`] yields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedDelta {
    /// Text for the response's `content` (may be empty).
    pub content: String,
    /// Tool-call deltas, in order.
    pub calls: Vec<ToolCallDelta>,
    /// Set by `finish` when the stream ended inside tool-call markup: the unfinished
    /// part came back as content (or, for a complete call missing only its closing
    /// tag, as a call), and the caller should not report the response as complete.
    pub cut: bool,
}

impl ParsedDelta {
    /// Nothing to send.
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.calls.is_empty() && !self.cut
    }
}

/// An incremental tool-call parser for one response.
pub trait ToolCallParser: Send {
    /// Feed the next detokenized text delta.
    fn push(&mut self, delta: &str) -> ParsedDelta;
    /// The stream has ended: release what was held back.
    fn finish(&mut self) -> ParsedDelta;
}

/// A complete tool call, from [`parse_whole`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// `call_` and 24 hex digits.
    pub id: String,
    /// The function's name.
    pub name: String,
    /// The arguments: a JSON value's text (an object, as models write them).
    pub arguments: String,
}

/// A whole response parsed at once: `(content, calls, cut)`, content `None` when empty.
pub fn parse_whole(parser: &mut dyn ToolCallParser, text: &str) -> (Option<String>, Vec<ToolCall>, bool) {
    let mut all = parser.push(text);
    let last = parser.finish();
    all.content.push_str(&last.content);
    all.calls.extend(last.calls);
    let mut calls: Vec<ToolCall> = Vec::new();
    for delta in all.calls {
        match calls.get_mut(delta.index) {
            Some(call) => call.arguments.push_str(&delta.arguments),
            None => calls.push(ToolCall {
                id: delta.id.unwrap_or_default(),
                name: delta.name.unwrap_or_default(),
                arguments: delta.arguments,
            }),
        }
    }
    let content = (!all.content.is_empty()).then_some(all.content);
    (content, calls, last.cut)
}

/// Whether the markup of the parser registered as `name` is made of special tokens
/// (`<|python_tag|>`, `[TOOL_CALLS]`, DeepSeek's `<｜tool▁calls▁begin｜>` …), which the
/// detokenizer must then keep for the parser to see them. Hermes' `<tool_call>` and
/// pythonic lists are plain text.
pub fn needs_special_tokens(name: &str) -> bool {
    matches!(name, "llama3_json" | "mistral" | "deepseek_v3")
}

/// The parser registered as `name`. `tools`: the names of the request's functions; a
/// call of any other function comes back as content (`None`: any name is accepted).
pub fn tool_call_parser(name: &str, tools: Option<Vec<String>>) -> Result<Box<dyn ToolCallParser>, UnknownParser> {
    let emitter = emit::CallEmitter::new(tools);
    Ok(match name {
        "deepseek_v3" => Box::new(deepseek_v3::DeepSeekV3::new(emitter)),
        "hermes" => Box::new(hermes::Hermes::new(emitter)),
        "llama3_json" => Box::new(llama3_json::Llama3Json::new(emitter)),
        "mistral" => Box::new(mistral::Mistral::new(emitter)),
        "pythonic" => Box::new(pythonic::Pythonic::new(emitter)),
        _ => {
            return Err(UnknownParser { kind: ParserKind::ToolCall, name: name.to_string(), known: TOOL_CALL_PARSERS })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_name_builds_and_others_list_them() {
        for name in TOOL_CALL_PARSERS {
            assert!(tool_call_parser(name, None).is_ok(), "{name}");
        }
        let err = tool_call_parser("hermes2", None).err().unwrap();
        assert_eq!(err.kind, ParserKind::ToolCall);
        assert_eq!(
            err.to_string(),
            "unknown tool-call parser \"hermes2\"; known: deepseek_v3, hermes, llama3_json, mistral, pythonic"
        );
    }
}

//! The chat output stage, between the detokenizer and the OpenAI chunks: each text
//! delta goes once through the model's reasoning parser, then through the tool-call
//! parser (or, for `tool_choice: required` / a named function, into the JSON the engine
//! was constrained to), and comes out as `content`, `reasoning_content` and
//! `tool_calls`; the finish reason becomes `tool_calls` when the answer ended in calls.

use std::borrow::Cow;

use serde_json::Value;

use crate::parsers::tool_calls::new_call_id;
use crate::parsers::{reasoning_parser, tool_call_parser, ReasoningParser, ToolCallDelta, ToolCallParser, UnknownParser};
use crate::protocols::openai::{FunctionCall, ToolCallItem};

/// How a request's output is parsed, decided when it is preprocessed (from the
/// request and the model card). The default parses nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputPlan {
    /// The tool-call parser's name (`tool_choice: auto` with tools).
    pub tool_parser: Option<String>,
    /// The request's function names (a call of another is content).
    pub tool_names: Vec<String>,
    /// The engine was constrained to JSON calls (`required` or a named function).
    pub constrained: Option<ConstrainedCalls>,
    /// The reasoning parser's name.
    pub reasoning_parser: Option<String>,
    /// `chat_template_kwargs.enable_thinking` (default true).
    pub thinking: bool,
}

/// The JSON shape a constrained engine writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConstrainedCalls {
    /// `[{"name": …, "parameters": {…}}, …]` (`tool_choice: required`).
    List,
    /// The named function's arguments object.
    Named(String),
}

impl OutputPlan {
    /// Whether anything is parsed.
    pub fn is_active(&self) -> bool {
        self.tool_parser.is_some() || self.constrained.is_some() || self.reasoning_parser.is_some()
    }
}

/// What one step of the stage yields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedStep {
    /// Text for `content` (may be empty).
    pub content: String,
    /// Text for `reasoning_content` (may be empty).
    pub reasoning: String,
    /// Whole calls, in OpenAI's delta shape.
    pub calls: Vec<ToolCallItem>,
}

/// The calls source of one response.
enum Calls {
    None,
    Parser(Box<dyn ToolCallParser>),
    /// The whole output is collected and read as JSON at the end.
    Constrained { shape: ConstrainedCalls, text: String },
}

/// The parsing state of one chat response.
pub struct ChatOutput {
    reasoning: Option<Box<dyn ReasoningParser>>,
    calls: Calls,
    emitted_calls: usize,
}

impl ChatOutput {
    /// The stage for `plan`; `None` when it parses nothing.
    pub fn new(plan: &OutputPlan) -> Result<Option<Self>, UnknownParser> {
        if !plan.is_active() {
            return Ok(None);
        }
        let calls = match (&plan.constrained, &plan.tool_parser) {
            (Some(shape), _) => Calls::Constrained { shape: shape.clone(), text: String::new() },
            (None, Some(name)) => Calls::Parser(tool_call_parser(name, Some(plan.tool_names.clone()))?),
            (None, None) => Calls::None,
        };
        // Under a JSON constraint the model cannot write thinking markup: a parser whose
        // output may start inside the block would take the JSON for thinking.
        let reasoning = match (&plan.reasoning_parser, &calls) {
            (Some(name), Calls::Parser(_) | Calls::None) => Some(reasoning_parser(name, plan.thinking)?),
            _ => None,
        };
        Ok(Some(ChatOutput { reasoning, calls, emitted_calls: 0 }))
    }

    /// Parse one delta; with `finish` (the engine's finish reason, OpenAI's spelling)
    /// the stream ends here: held-back text is released and the finish reason to
    /// report is returned (`tool_calls` when calls were made and the engine stopped
    /// normally; the engine's own when the output was cut inside a call).
    pub fn step(&mut self, text: &str, finish: Option<String>) -> (ParsedStep, Option<String>) {
        let mut out = ParsedStep::default();
        let answer = match &mut self.reasoning {
            Some(parser) => {
                let mut d = parser.push(text);
                if finish.is_some() {
                    let last = parser.finish();
                    d.reasoning.push_str(&last.reasoning);
                    d.content.push_str(&last.content);
                }
                out.reasoning = d.reasoning;
                Cow::Owned(d.content)
            }
            None => Cow::Borrowed(text),
        };
        let mut cut = false;
        match &mut self.calls {
            Calls::None => out.content = answer.into_owned(),
            Calls::Parser(parser) => {
                let mut d = parser.push(&answer);
                if finish.is_some() {
                    let last = parser.finish();
                    d.content.push_str(&last.content);
                    d.calls.extend(last.calls);
                    cut = last.cut;
                }
                out.content = d.content;
                out.calls = d.calls.into_iter().map(call_item).collect();
            }
            Calls::Constrained { shape, text } => {
                text.push_str(&answer);
                if finish.is_some() {
                    let whole = std::mem::take(text);
                    match constrained_calls(shape, &whole) {
                        Some(calls) => out.calls = calls,
                        None => {
                            out.content = whole;
                            cut = true;
                        }
                    }
                }
            }
        }
        self.emitted_calls += out.calls.len();
        let finish = finish.map(|reason| {
            if self.emitted_calls > 0 && !cut && reason == "stop" {
                "tool_calls".to_string()
            } else {
                reason
            }
        });
        (out, finish)
    }
}

/// A parser's call delta in OpenAI's shape.
fn call_item(d: ToolCallDelta) -> ToolCallItem {
    ToolCallItem {
        index: Some(d.index),
        kind: d.id.as_ref().map(|_| "function".to_string()),
        id: d.id,
        function: FunctionCall { name: d.name, arguments: Some(d.arguments) },
    }
}

/// The calls in a constrained engine's whole output; `None` when it is not the JSON
/// the constraint asked for (a stream cut by `max_tokens`, or an engine that ignores
/// constraints).
fn constrained_calls(shape: &ConstrainedCalls, text: &str) -> Option<Vec<ToolCallItem>> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    let calls: Vec<(String, String)> = match shape {
        ConstrainedCalls::Named(name) => {
            value.as_object()?;
            vec![(name.clone(), text.trim().to_string())]
        }
        ConstrainedCalls::List => {
            let list = value.as_array().filter(|l| !l.is_empty())?;
            list.iter()
                .map(|call| {
                    let name = call.get("name")?.as_str()?.to_string();
                    let parameters = call.get("parameters").filter(|p| p.is_object())?;
                    Some((name, parameters.to_string()))
                })
                .collect::<Option<_>>()?
        }
    };
    Some(
        calls
            .into_iter()
            .enumerate()
            .map(|(index, (name, arguments))| ToolCallItem {
                index: Some(index),
                id: Some(new_call_id()),
                kind: Some("function".to_string()),
                function: FunctionCall { name: Some(name), arguments: Some(arguments) },
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(tool_parser: Option<&str>, reasoning: Option<&str>) -> OutputPlan {
        OutputPlan {
            tool_parser: tool_parser.map(String::from),
            tool_names: vec!["get_weather".into()],
            reasoning_parser: reasoning.map(String::from),
            thinking: true,
            ..Default::default()
        }
    }

    /// Feed `pieces`, the last with `finish`; everything concatenated, and the finish reason.
    fn run(plan: &OutputPlan, pieces: &[&str], finish: &str) -> (ParsedStep, Option<String>) {
        let mut stage = ChatOutput::new(plan).unwrap().unwrap();
        let mut all = ParsedStep::default();
        let mut reason = None;
        for (i, piece) in pieces.iter().enumerate() {
            let last = i + 1 == pieces.len();
            let (step, r) = stage.step(piece, last.then(|| finish.to_string()));
            all.content.push_str(&step.content);
            all.reasoning.push_str(&step.reasoning);
            all.calls.extend(step.calls);
            reason = r;
        }
        (all, reason)
    }

    fn chars(text: &str) -> Vec<&str> {
        text.char_indices().map(|(i, c)| &text[i..i + c.len_utf8()]).collect()
    }

    #[test]
    fn nothing_to_parse_builds_no_stage() {
        assert!(ChatOutput::new(&OutputPlan::default()).unwrap().is_none());
    }

    #[test]
    fn reasoning_then_a_call_split_out_of_a_stream_of_any_split() {
        let text = "<think>user wants weather</think>Let me check.<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Zürich\"}}</tool_call>";
        let p = plan(Some("hermes"), Some("deepseek_r1"));
        for pieces in [vec![text], chars(text)] {
            let (all, reason) = run(&p, &pieces, "stop");
            assert_eq!(all.reasoning, "user wants weather");
            assert_eq!(all.content, "Let me check.");
            assert_eq!(all.calls.len(), 1);
            let call = &all.calls[0];
            assert_eq!((call.index, call.kind.as_deref()), (Some(0), Some("function")));
            assert!(call.id.as_deref().is_some_and(|id| id.starts_with("call_") && id.len() == 29));
            assert_eq!(call.function.name.as_deref(), Some("get_weather"));
            assert_eq!(call.function.arguments.as_deref(), Some("{\"city\": \"Zürich\"}"));
            assert_eq!(reason.as_deref(), Some("tool_calls"));
        }
    }

    #[test]
    fn plain_text_keeps_stop_and_a_cut_call_is_content_with_the_engines_reason() {
        let p = plan(Some("hermes"), None);
        let (all, reason) = run(&p, &["Hello", " there"], "stop");
        assert_eq!((all.content.as_str(), all.calls.len(), reason.as_deref()), ("Hello there", 0, Some("stop")));
        let (all, reason) = run(&p, &chars("Sure.<tool_call>{\"name\": \"get_weather\", \"argu"), "length");
        assert!(all.calls.is_empty());
        assert_eq!(all.content, "Sure.<tool_call>{\"name\": \"get_weather\", \"argu");
        assert_eq!(reason.as_deref(), Some("length"));
        // A call of a function the request did not offer is content, not a call.
        let (all, reason) = run(&p, &["<tool_call>{\"name\": \"rm\", \"arguments\": {}}</tool_call>"], "stop");
        assert!(all.calls.is_empty() && all.content.contains("rm"));
        assert_eq!(reason.as_deref(), Some("stop"));
    }

    #[test]
    fn thinking_off_makes_everything_content() {
        let mut p = plan(None, Some("qwen3"));
        p.thinking = false;
        let (all, _) = run(&p, &chars("plain answer"), "stop");
        assert_eq!((all.reasoning.as_str(), all.content.as_str()), ("", "plain answer"));
        p.thinking = true;
        let (all, reason) = run(&p, &chars("<think>hmm</think>answer"), "stop");
        assert_eq!((all.reasoning.as_str(), all.content.as_str(), reason.as_deref()), ("hmm", "answer", Some("stop")));
    }

    #[test]
    fn constrained_output_is_read_as_json_calls() {
        let list = OutputPlan { constrained: Some(ConstrainedCalls::List), reasoning_parser: Some("deepseek_r1".into()), ..Default::default() };
        let text = r#"[{"name":"get_weather","parameters":{"city":"Paris"}},{"name":"now","parameters":{}}]"#;
        let (all, reason) = run(&list, &chars(text), "stop");
        assert_eq!(all.content, "");
        assert_eq!(all.reasoning, "");
        let names: Vec<_> = all.calls.iter().map(|c| c.function.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["get_weather", "now"]);
        assert_eq!(all.calls[0].function.arguments.as_deref(), Some(r#"{"city":"Paris"}"#));
        assert_eq!(all.calls[1].index, Some(1));
        assert_eq!(reason.as_deref(), Some("tool_calls"));

        let named = OutputPlan { constrained: Some(ConstrainedCalls::Named("get_weather".into())), ..Default::default() };
        let (all, reason) = run(&named, &[r#"{"city": "#, r#""Paris"}"#], "stop");
        assert_eq!(all.calls[0].function.arguments.as_deref(), Some(r#"{"city": "Paris"}"#));
        assert_eq!(reason.as_deref(), Some("tool_calls"));
        // Cut by max_tokens: no half call, the text as content, the engine's reason.
        let (all, reason) = run(&named, &[r#"{"city": "Pa"#], "length");
        assert!(all.calls.is_empty());
        assert_eq!((all.content.as_str(), reason.as_deref()), (r#"{"city": "Pa"#, Some("length")));
    }
}

//! `llama3_json`: Llama 3.1/3.2/3.3's JSON tool calls, `{"name": ..., "parameters":
//! {...}}` (or `"arguments"`), several separated by `;`, after `<|python_tag|>` or as
//! the whole answer (a JSON object where the output begins). `<|python_tag|>` is a
//! special token: the detokenizer must keep it.

use super::balance::BracketScanner;
use super::call_json::name_and_arguments;
use super::content::ContentUntil;
use super::emit::CallEmitter;
use super::{ParsedDelta, ToolCallParser};

const PYTHON_TAG: &str = "<|python_tag|>";

enum State {
    /// Only whitespace (or part of `<|python_tag|>`) so far.
    Start(String),
    Content(ContentUntil),
    /// Calls may follow: before the first one, or after `;`.
    Between,
    /// Inside a call's JSON object.
    Object(BracketScanner, String),
}

/// The `llama3_json` parser.
pub(super) struct Llama3Json {
    emitter: CallEmitter,
    state: State,
    /// Markup and blanks read since the last call, returned as content if no call follows.
    raw: String,
}

fn content_state() -> State {
    State::Content(ContentUntil::new(&[PYTHON_TAG]))
}

impl Llama3Json {
    pub(super) fn new(emitter: CallEmitter) -> Self {
        Llama3Json { emitter, state: State::Start(String::new()), raw: String::new() }
    }

    /// What was read as a possible call is content after all.
    fn fail(&mut self, out: &mut ParsedDelta) {
        let raw = std::mem::take(&mut self.raw);
        self.emitter.content(&raw, &mut out.content);
        self.state = content_state();
    }
}

impl ToolCallParser for Llama3Json {
    fn push(&mut self, delta: &str) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        let mut text = delta.to_string();
        loop {
            match std::mem::replace(&mut self.state, State::Between) {
                State::Start(mut lead) => {
                    lead.push_str(&text);
                    let trimmed = lead.trim_start();
                    if trimmed.is_empty() || (trimmed.len() < PYTHON_TAG.len() && PYTHON_TAG.starts_with(trimmed)) {
                        self.state = State::Start(lead);
                        return out;
                    }
                    if trimmed.starts_with('{') {
                        self.state = State::Between;
                    } else {
                        self.state = content_state();
                    }
                    text = lead;
                }
                State::Content(mut content) => match content.push(&text, &mut self.emitter, &mut out.content) {
                    None => {
                        self.state = State::Content(content);
                        return out;
                    }
                    Some(after) => {
                        self.raw = PYTHON_TAG.to_string();
                        text = after;
                    }
                },
                State::Between => {
                    let rest = text.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
                    self.raw.push_str(&text[..text.len() - rest.len()]);
                    if rest.is_empty() {
                        return out;
                    }
                    let rest = rest.to_string();
                    if rest.starts_with('{') {
                        self.state = State::Object(BracketScanner::new(&['"']), String::new());
                    } else {
                        self.fail(&mut out);
                    }
                    text = rest;
                }
                State::Object(mut scanner, mut object) => match scanner.feed(&text) {
                    None => {
                        object.push_str(&text);
                        self.raw.push_str(&text);
                        self.state = State::Object(scanner, object);
                        return out;
                    }
                    Some(end) => {
                        object.push_str(&text[..end]);
                        self.raw.push_str(&text[..end]);
                        match name_and_arguments(&object) {
                            Some((name, arguments)) if self.emitter.allows(&name) => {
                                self.raw.clear();
                                out.calls.push(self.emitter.call(name, arguments));
                                self.state = State::Between;
                            }
                            _ => self.fail(&mut out),
                        }
                        text = text[end..].to_string();
                    }
                },
            }
        }
    }

    fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match std::mem::replace(&mut self.state, content_state()) {
            State::Start(lead) => self.emitter.content(&lead, &mut out.content),
            State::Content(mut content) => content.finish(&mut self.emitter, &mut out.content),
            // Blanks or `;` after the last call, or a lone tag: nothing to say.
            State::Between => {}
            State::Object(..) => {
                out.cut = true;
                self.fail(&mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::test_feed::{check, check_with, Expect};

    const P: &str = "llama3_json";

    #[test]
    fn one_call_with_and_without_the_tag() {
        let want = Expect::calls(&[("get_weather", r#"{"city": "Paris"}"#)]);
        check(P, r#"{"name": "get_weather", "parameters": {"city": "Paris"}}"#, &want);
        check(P, r#"<|python_tag|>{"name": "get_weather", "arguments": {"city": "Paris"}}"#, &want);
        check(P, " \n{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}\n", &want);
    }

    #[test]
    fn parallel_calls_with_text_before_and_after() {
        let want = Expect::calls(&[("a", r#"{"x": 1}"#), ("b", "{}")]);
        check(P, r#"{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}"#, &want);
        let want = want.content_too("Calling.\nThen more.");
        check(P, "Calling.<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": 1}};{\"name\": \"b\", \"parameters\": {}}\nThen more.", &want);
    }

    #[test]
    fn nested_json_escaped_quotes_and_unicode() {
        let args = r#"{"q": "say \"hi\" }; {", "n": {"l": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        check(P, &format!(r#"{{"name": "f", "parameters": {args}}}"#), &Expect::calls(&[("f", args)]));
    }

    #[test]
    fn malformed_and_plain_json_are_content() {
        for text in [
            r#"{"name": "f", "parameters": {"a": }}"#,
            r#"{"answer": 42}"#,
            "The JSON is {\"name\": \"f\", \"parameters\": {}}",
            "<|python_tag|>print(1)",
        ] {
            check(P, text, &Expect::content(text));
        }
    }

    #[test]
    fn unknown_name_is_content() {
        let text = r#"{"name": "rm", "parameters": {}}"#;
        check_with(P, Some(&["ls"]), text, &Expect::content(text));
    }

    #[test]
    fn a_stream_cut_inside_a_call_says_so() {
        let text = r#"{"name": "f", "parameters": {"a": "#;
        check(P, text, &Expect::content(text).cut());
    }
}

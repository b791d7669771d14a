//! `hermes`: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one tag per
//! call. Hermes 2/3 (NousResearch), Qwen 2.5 and Qwen3 (their chat templates write
//! this format), and other ChatML models fine-tuned on it.

use std::borrow::Cow;

use super::call_json::name_and_arguments;
use super::content::ContentUntil;
use super::emit::CallEmitter;
use super::{ParsedDelta, ToolCallParser};
use crate::parsers::marker::{MarkerSearch, Search};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

/// The `hermes` parser.
pub(super) struct Hermes {
    emitter: CallEmitter,
    start: ContentUntil,
    end: MarkerSearch,
    /// Inside a tag: the text since `<tool_call>`.
    body: Option<String>,
}

impl Hermes {
    pub(super) fn new(emitter: CallEmitter) -> Self {
        Hermes { emitter, start: ContentUntil::new(&[START]), end: MarkerSearch::new(&[END]), body: None }
    }

    /// A closed (or, at the end, unclosed) tag's body: a call, or its text as content.
    fn close(&mut self, body: &str, closed: bool, out: &mut ParsedDelta) {
        match name_and_arguments(body) {
            Some((name, arguments)) if self.emitter.allows(&name) => {
                out.calls.push(self.emitter.call(name, arguments));
            }
            _ => {
                let raw = if closed { format!("{START}{body}{END}") } else { format!("{START}{body}") };
                self.emitter.content(&raw, &mut out.content);
            }
        }
    }
}

impl ToolCallParser for Hermes {
    fn push(&mut self, delta: &str) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        let mut text = Cow::Borrowed(delta);
        loop {
            match self.body.take() {
                None => match self.start.push(&text, &mut self.emitter, &mut out.content) {
                    None => return out,
                    Some(after) => {
                        self.body = Some(String::new());
                        text = Cow::Owned(after);
                    }
                },
                Some(mut body) => match self.end.push(&text) {
                    Search::Pending(part) => {
                        body.push_str(&part);
                        self.body = Some(body);
                        return out;
                    }
                    Search::Found { before, after, .. } => {
                        body.push_str(&before);
                        self.close(&body, true, &mut out);
                        text = Cow::Owned(after);
                    }
                },
            }
        }
    }

    fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match self.body.take() {
            None => self.start.finish(&mut self.emitter, &mut out.content),
            Some(mut body) => {
                body.push_str(&self.end.flush());
                out.cut = true;
                self.close(&body, false, &mut out);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::test_feed::{check, Expect};

    const P: &str = "hermes";

    #[test]
    fn one_call() {
        check(
            P,
            r#"<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>"#,
            &Expect::calls(&[("get_weather", r#"{"city": "Paris"}"#)]),
        );
    }

    #[test]
    fn parallel_calls_with_text_before_and_after() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>\nDone.";
        check(P, text, &Expect::calls(&[("a", r#"{"x": 1}"#), ("b", "{}")]).content_too("Let me check.\n\nDone."));
    }

    #[test]
    fn nested_json_escaped_quotes_and_unicode() {
        let args =
            r#"{"q": "say \"hi\" </tool_call> {", "nested": {"list": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        let text = format!(r#"<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>"#);
        // The end tag inside a string ends the tag (as in vLLM): the JSON is cut, so
        // the text up to it is content.
        check(P, &text, &Expect::content(&text));
        let args = r#"{"q": "say \"hi\" {", "nested": {"list": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        let text = format!(r#"<tool_call>{{"name": "f", "arguments": {args}}}</tool_call>"#);
        check(P, &text, &Expect::calls(&[("f", args)]));
    }

    #[test]
    fn malformed_is_content() {
        for text in [
            r#"<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>"#,
            r#"<tool_call>not json</tool_call> after"#,
            r#"<tool_call>{"arguments": {}}</tool_call>"#,
        ] {
            check(P, text, &Expect::content(text));
        }
    }

    #[test]
    fn unknown_name_is_content() {
        let text = r#"<tool_call>{"name": "rm", "arguments": {}}</tool_call>"#;
        crate::parsers::test_feed::check_with(P, Some(&["ls"]), text, &Expect::content(text));
        crate::parsers::test_feed::check_with(P, Some(&["rm"]), text, &Expect::calls(&[("rm", "{}")]));
    }

    #[test]
    fn a_stream_cut_inside_a_call_says_so() {
        let text = r#"Hi<tool_call>{"name": "f", "argu"#;
        check(P, text, &Expect::content(text).cut());
        let text = r#"<tool_call>{"name": "f", "arguments": {}}"#;
        check(P, text, &Expect::calls(&[("f", "{}")]).cut());
    }

    #[test]
    fn no_markup_is_all_content() {
        check(P, "plain <tool text < >", &Expect::content("plain <tool text < >"));
    }
}

//! `deepseek_v3`: DeepSeek-V3 and R1-0528's markup —
//! `<｜tool▁calls▁begin｜>` then, per call,
//! `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`,
//! then `<｜tool▁calls▁end｜>`. The markers are special tokens: the detokenizer must keep
//! them (skip_special_tokens off).

use super::content::ContentUntil;
use super::emit::CallEmitter;
use super::{ParsedDelta, ToolCallParser};
use crate::parsers::marker::{MarkerSearch, Search};

const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

enum State {
    Content(ContentUntil),
    /// Inside the calls block, between calls.
    Block(MarkerSearch),
    /// Inside a call: its text so far.
    Call(MarkerSearch, String),
}

/// The `deepseek_v3` parser.
pub(super) struct DeepSeekV3 {
    emitter: CallEmitter,
    state: State,
}

impl DeepSeekV3 {
    pub(super) fn new(emitter: CallEmitter) -> Self {
        DeepSeekV3 { emitter, state: State::Content(ContentUntil::new(&[CALLS_BEGIN])) }
    }

    fn close(&mut self, body: &str, closed: bool, out: &mut ParsedDelta) {
        match name_and_arguments(body) {
            Some((name, arguments)) if self.emitter.allows(&name) => out.calls.push(self.emitter.call(name, arguments)),
            _ => {
                let end = if closed { CALL_END } else { "" };
                self.emitter.content(&format!("{CALL_BEGIN}{body}{end}"), &mut out.content);
            }
        }
    }
}

/// `function<｜tool▁sep｜>NAME\n```json\nARGS\n```` → `(NAME, ARGS)`, ARGS valid JSON.
fn name_and_arguments(body: &str) -> Option<(String, String)> {
    let (_kind, rest) = body.split_once(SEP)?;
    let (name, rest) = rest.split_once('\n')?;
    let args = rest.trim().strip_prefix("```json")?.strip_suffix("```")?.trim();
    serde_json::from_str::<serde::de::IgnoredAny>(args).ok()?;
    Some((name.trim().to_string(), args.to_string()))
}

impl ToolCallParser for DeepSeekV3 {
    fn push(&mut self, delta: &str) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        let mut text = delta.to_string();
        loop {
            let state = std::mem::replace(&mut self.state, State::Content(ContentUntil::new(&[])));
            match state {
                State::Content(mut content) => match content.push(&text, &mut self.emitter, &mut out.content) {
                    None => {
                        self.state = State::Content(content);
                        return out;
                    }
                    Some(after) => {
                        self.state = State::Block(MarkerSearch::new(&[CALL_BEGIN, CALLS_END]));
                        text = after;
                    }
                },
                State::Block(mut search) => match search.push(&text) {
                    Search::Pending(_between) => {
                        self.state = State::Block(search);
                        return out;
                    }
                    Search::Found { which: 0, after, .. } => {
                        self.state = State::Call(MarkerSearch::new(&[CALL_END]), String::new());
                        text = after;
                    }
                    Search::Found { after, .. } => {
                        self.state = State::Content(ContentUntil::new(&[CALLS_BEGIN]));
                        text = after;
                    }
                },
                State::Call(mut search, mut body) => match search.push(&text) {
                    Search::Pending(part) => {
                        body.push_str(&part);
                        self.state = State::Call(search, body);
                        return out;
                    }
                    Search::Found { before, after, .. } => {
                        body.push_str(&before);
                        self.close(&body, true, &mut out);
                        self.state = State::Block(MarkerSearch::new(&[CALL_BEGIN, CALLS_END]));
                        text = after;
                    }
                },
            }
        }
    }

    fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match std::mem::replace(&mut self.state, State::Content(ContentUntil::new(&[]))) {
            State::Content(mut content) => content.finish(&mut self.emitter, &mut out.content),
            State::Block(_) => out.cut = true,
            State::Call(mut search, mut body) => {
                body.push_str(&search.flush());
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

    const P: &str = "deepseek_v3";

    fn call(name: &str, args: &str) -> String {
        format!("<｜tool▁call▁begin｜>function<｜tool▁sep｜>{name}\n```json\n{args}\n```<｜tool▁call▁end｜>")
    }

    fn block(calls: &[String]) -> String {
        format!("<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>", calls.join("\n"))
    }

    #[test]
    fn one_call() {
        check(
            P,
            &block(&[call("get_weather", r#"{"city": "Paris"}"#)]),
            &Expect::calls(&[("get_weather", r#"{"city": "Paris"}"#)]),
        );
    }

    #[test]
    fn parallel_calls_with_text_before_and_after() {
        let text = format!("Checking.{}\nDone.", block(&[call("a", r#"{"x": 1}"#), call("b", "{}")]));
        check(P, &text, &Expect::calls(&[("a", r#"{"x": 1}"#), ("b", "{}")]).content_too("Checking.\nDone."));
    }

    #[test]
    fn nested_json_escaped_quotes_and_unicode() {
        let args = r#"{"q": "say \"hi\" ```", "n": {"l": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        check(P, &block(&[call("f", args)]), &Expect::calls(&[("f", args)]));
    }

    #[test]
    fn malformed_is_content() {
        let bad = call("f", r#"{"a": }"#);
        check(P, &block(std::slice::from_ref(&bad)), &Expect::content(&bad));
        let bad = "<｜tool▁call▁begin｜>function f {}<｜tool▁call▁end｜>";
        check(P, &block(&[bad.to_string()]), &Expect::content(bad));
    }

    #[test]
    fn unknown_name_is_content() {
        let c = call("rm", "{}");
        crate::parsers::test_feed::check_with(P, Some(&["ls"]), &block(std::slice::from_ref(&c)), &Expect::content(&c));
    }

    #[test]
    fn a_stream_cut_inside_a_call_says_so() {
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\"";
        check(P, text, &Expect::content("<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\"").cut());
        let text = format!("<｜tool▁calls▁begin｜>{}", call("f", "{}"));
        check(P, &text, &Expect::calls(&[("f", "{}")]).cut());
    }
}

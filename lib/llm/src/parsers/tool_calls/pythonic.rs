//! `pythonic`: the answer is a Python list of calls, `[f(a=1), g(b="x")]` — Llama
//! 3.2 (1B/3B) and Llama 4 with their pythonic templates, ToolACE, and other models
//! trained on that format. Only a list where the output begins counts.

use super::balance::BracketScanner;
use super::emit::CallEmitter;
use super::python_literal::parse_calls;
use super::{ParsedDelta, ToolCallParser};

enum State {
    /// Only whitespace so far.
    Start(String),
    Content,
    /// Inside the list: its text so far.
    List(BracketScanner, String),
}

/// The `pythonic` parser.
pub(super) struct Pythonic {
    emitter: CallEmitter,
    state: State,
}

impl Pythonic {
    pub(super) fn new(emitter: CallEmitter) -> Self {
        Pythonic { emitter, state: State::Start(String::new()) }
    }

    fn close(&mut self, list: &str, out: &mut ParsedDelta) {
        match parse_calls(list) {
            Some(calls) if calls.iter().all(|(name, _)| self.emitter.allows(name)) => {
                for (name, arguments) in calls {
                    out.calls.push(self.emitter.call(name, arguments));
                }
            }
            _ => self.emitter.content(list, &mut out.content),
        }
    }
}

impl ToolCallParser for Pythonic {
    fn push(&mut self, delta: &str) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match std::mem::replace(&mut self.state, State::Content) {
            State::Content => self.emitter.content(delta, &mut out.content),
            State::Start(mut lead) => {
                lead.push_str(delta);
                if lead.trim_start().is_empty() {
                    self.state = State::Start(lead);
                } else if lead.trim_start().starts_with('[') {
                    self.state = State::List(BracketScanner::new(&['"', '\'']), String::new());
                    return self.push(&lead);
                } else {
                    self.emitter.content(&lead, &mut out.content);
                }
            }
            State::List(mut scanner, mut list) => match scanner.feed(delta) {
                None => {
                    list.push_str(delta);
                    self.state = State::List(scanner, list);
                }
                Some(end) => {
                    list.push_str(&delta[..end]);
                    self.close(&list, &mut out);
                    self.emitter.content(&delta[end..], &mut out.content);
                }
            },
        }
        out
    }

    fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match std::mem::replace(&mut self.state, State::Content) {
            State::Start(lead) => self.emitter.content(&lead, &mut out.content),
            State::Content => {}
            State::List(_, list) => {
                out.cut = true;
                self.emitter.content(&list, &mut out.content);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::test_feed::{check, check_with, Expect};

    const P: &str = "pythonic";

    #[test]
    fn one_call() {
        check(P, r#"[get_weather(city="Paris")]"#, &Expect::calls(&[("get_weather", r#"{"city": "Paris"}"#)]));
    }

    #[test]
    fn parallel_calls_and_text_after() {
        let want = Expect::calls(&[("a", r#"{"x": 1}"#), ("b", r#"{"s": "x"}"#)]);
        check(P, "\n[a(x=1), b(s='x')]\n", &want);
        check(P, "[a(x=1), b(s='x')] Done.", &want.content_too(" Done."));
    }

    #[test]
    fn nested_values_escaped_quotes_and_unicode() {
        let text = r#"[f(q="say \"hi\" ])", n={"l": [1, {"k": 'v'}]}, city="Zürich 東京 🦀")]"#;
        let args = r#"{"q": "say \"hi\" ])", "n": {"l": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        check(P, text, &Expect::calls(&[("f", args)]));
    }

    #[test]
    fn text_before_a_list_or_malformed_is_content() {
        for text in ["I will call [f(a=1)]", "[f(a=)]", "[not, calls]", "[1, 2, 3]"] {
            check(P, text, &Expect::content(text));
        }
    }

    #[test]
    fn unknown_name_is_content() {
        check_with(P, Some(&["ls"]), "[rm(path='/')]", &Expect::content("[rm(path='/')]"));
    }

    #[test]
    fn a_stream_cut_inside_a_call_says_so() {
        check(P, "[f(a=1), g(b=", &Expect::content("[f(a=1), g(b=").cut());
    }
}

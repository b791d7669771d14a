//! `mistral`: after `[TOOL_CALLS]`, either a JSON list of call objects
//! (`[{"name": ..., "arguments": {...}}, ...]`, tokenizers before v11: Mistral 7B
//! v0.3, Mixtral 8x22B, Mistral Nemo) or `NAME[ARGS]{...}` (v11 and later: Mistral
//! Small 3.x, Large 2411, Magistral, Devstral), repeated for parallel calls;
//! `NAME[CALL_ID]ID[ARGS]{...}` is accepted too. `[TOOL_CALLS]` and `[ARGS]` are
//! special tokens: the detokenizer must keep them.

use super::balance::BracketScanner;
use super::call_json::name_and_arguments;
use super::content::ContentUntil;
use super::emit::CallEmitter;
use super::{ParsedDelta, ToolCallParser};
use crate::parsers::marker::{MarkerSearch, Search};

const BOT: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
/// What ends a v11 call's name: its arguments, or (a name that is none) the next call.
const NAME_ENDS: &[&str] = &[ARGS, "{", BOT];
/// A function name longer than this is not one: the text is content.
const MAX_NAME: usize = 256;

enum State {
    Content(ContentUntil),
    /// Just after `[TOOL_CALLS]`: which form follows is not known yet.
    Open,
    /// A JSON list of calls: the scanner and the list's text.
    List(BracketScanner, String),
    /// The v11 form's name, up to `[ARGS]` or `{`.
    Name(MarkerSearch, String),
    /// The v11 form's arguments object: scanner, name, the object's text.
    Args(BracketScanner, String, String),
}

/// The `mistral` parser.
pub(super) struct Mistral {
    emitter: CallEmitter,
    state: State,
    /// The raw text of the call being read, returned as content if it fails.
    raw: String,
}

fn content_state() -> State {
    State::Content(ContentUntil::new(&[BOT]))
}

impl Mistral {
    pub(super) fn new(emitter: CallEmitter) -> Self {
        Mistral { emitter, state: content_state(), raw: String::new() }
    }

    /// The call's text (after `[TOOL_CALLS]`) failed: all of it is content.
    fn fail(&mut self, out: &mut ParsedDelta) {
        let raw = std::mem::take(&mut self.raw);
        self.emitter.content(&raw, &mut out.content);
        self.state = content_state();
    }

    fn list(&mut self, list: &str, out: &mut ParsedDelta) {
        let valid = serde_json::from_str::<Vec<serde::de::IgnoredAny>>(list).is_ok();
        // Each element's own text, so that the arguments keep the model's key order.
        let calls = valid
            .then(|| list_items(list))
            .flatten()
            .and_then(|items| items.into_iter().map(name_and_arguments).collect::<Option<Vec<_>>>());
        match calls {
            Some(calls) if calls.iter().all(|(name, _)| self.emitter.allows(name)) => {
                self.raw.clear();
                for (name, arguments) in calls {
                    out.calls.push(self.emitter.call(name, arguments));
                }
                self.state = content_state();
            }
            _ => self.fail(out),
        }
    }
}

/// The element texts of a valid JSON list.
fn list_items(list: &str) -> Option<Vec<&str>> {
    let mut rest = list.trim().strip_prefix('[')?.strip_suffix(']')?.trim_start();
    let mut items = Vec::new();
    while !rest.is_empty() {
        let end = BracketScanner::new(&['"']).feed(rest)?;
        items.push(&rest[..end]);
        rest = rest[end..].trim_start();
        rest = rest.strip_prefix(',').unwrap_or(rest).trim_start();
    }
    Some(items)
}

impl ToolCallParser for Mistral {
    fn push(&mut self, delta: &str) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        let mut text = delta.to_string();
        loop {
            match std::mem::replace(&mut self.state, State::Open) {
                State::Content(mut content) => match content.push(&text, &mut self.emitter, &mut out.content) {
                    None => {
                        self.state = State::Content(content);
                        return out;
                    }
                    Some(after) => {
                        self.raw = BOT.to_string();
                        text = after;
                    }
                },
                State::Open => {
                    let rest = text.trim_start();
                    self.raw.push_str(&text[..text.len() - rest.len()]);
                    if rest.is_empty() {
                        return out;
                    }
                    let rest = rest.to_string();
                    if rest.starts_with('[') {
                        self.state = State::List(BracketScanner::new(&['"']), String::new());
                    } else {
                        self.state = State::Name(MarkerSearch::new(NAME_ENDS), String::new());
                    }
                    text = rest;
                }
                State::List(mut scanner, mut list) => match scanner.feed(&text) {
                    None => {
                        list.push_str(&text);
                        self.raw.push_str(&text);
                        self.state = State::List(scanner, list);
                        return out;
                    }
                    Some(end) => {
                        list.push_str(&text[..end]);
                        self.raw.push_str(&text[..end]);
                        self.list(&list, &mut out);
                        text = text[end..].to_string();
                    }
                },
                State::Name(mut search, mut name) => {
                    // A name has no blanks: the first blank ends it (as content).
                    let blank = text.find(char::is_whitespace);
                    let (head, tail) = text.split_at(blank.unwrap_or(text.len()));
                    let tail = tail.to_string();
                    match search.push(head) {
                        Search::Pending(part) => {
                            name.push_str(&part);
                            self.raw.push_str(&part);
                            if blank.is_none() && name.len() <= MAX_NAME {
                                self.state = State::Name(search, name);
                                return out;
                            }
                            let held = search.flush();
                            self.fail(&mut out);
                            text = held + &tail;
                        }
                        Search::Found { before, which, after } => {
                            name.push_str(&before);
                            self.raw.push_str(&before);
                            let after = after + &tail;
                            let name = match name.split_once(CALL_ID) {
                                Some((name, _id)) => name.to_string(),
                                None => name,
                            };
                            if NAME_ENDS[which] == BOT || name.is_empty() || name.len() > MAX_NAME {
                                self.fail(&mut out);
                                text = format!("{}{after}", NAME_ENDS[which]);
                                continue;
                            }
                            if NAME_ENDS[which] == ARGS {
                                self.raw.push_str(ARGS);
                                text = after;
                            } else {
                                text = format!("{{{after}");
                            }
                            self.state = State::Args(BracketScanner::new(&['"']), name, String::new());
                        }
                    }
                }
                State::Args(mut scanner, name, mut args) => {
                    if args.is_empty() && !text.trim_start().starts_with('{') {
                        let rest = text.trim_start();
                        self.raw.push_str(&text[..text.len() - rest.len()]);
                        if rest.is_empty() {
                            self.state = State::Args(scanner, name, args);
                            return out;
                        }
                        let rest = rest.to_string();
                        self.fail(&mut out);
                        text = rest;
                        continue;
                    }
                    match scanner.feed(&text) {
                        None => {
                            args.push_str(&text);
                            self.raw.push_str(&text);
                            self.state = State::Args(scanner, name, args);
                            return out;
                        }
                        Some(end) => {
                            args.push_str(&text[..end]);
                            self.raw.push_str(&text[..end]);
                            let args = args.trim_start();
                            let valid = serde_json::from_str::<serde::de::IgnoredAny>(args).is_ok();
                            if valid && self.emitter.allows(&name) {
                                self.raw.clear();
                                out.calls.push(self.emitter.call(name, args.to_string()));
                                self.state = content_state();
                            } else {
                                self.fail(&mut out);
                            }
                            text = text[end..].to_string();
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> ParsedDelta {
        let mut out = ParsedDelta::default();
        match std::mem::replace(&mut self.state, content_state()) {
            State::Content(mut content) => content.finish(&mut self.emitter, &mut out.content),
            State::Name(mut search, _) => {
                self.raw.push_str(&search.flush());
                out.cut = true;
                self.fail(&mut out);
            }
            State::Open | State::List(..) | State::Args(..) => {
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

    const P: &str = "mistral";

    #[test]
    fn one_call_both_forms() {
        let want = Expect::calls(&[("get_weather", r#"{"city": "Paris"}"#)]);
        check(P, r#"[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]"#, &want);
        check(P, r#"[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}"#, &want);
        check(P, r#"[TOOL_CALLS]get_weather{"city": "Paris"}"#, &want);
        check(P, r#"[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}"#, &want);
    }

    #[test]
    fn parallel_calls_with_text_before_and_after() {
        let want = Expect::calls(&[("a", r#"{"x": 1}"#), ("b", "{}")]).content_too("Sure. ");
        check(P, r#"Sure. [TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]"#, &want);
        check(P, r#"Sure. [TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}"#, &want);
        let want = Expect::calls(&[("a", "{}")]).content_too("Sure. \nok");
        check(P, "Sure. [TOOL_CALLS]a[ARGS]{}\nok", &want);
    }

    #[test]
    fn nested_json_escaped_quotes_and_unicode() {
        let args = r#"{"q": "say \"hi\" [ARGS] }{", "n": {"l": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}"#;
        check(P, &format!("[TOOL_CALLS]f[ARGS]{args}"), &Expect::calls(&[("f", args)]));
        check(P, &format!(r#"[TOOL_CALLS][{{"name": "f", "arguments": {args}}}]"#), &Expect::calls(&[("f", args)]));
    }

    #[test]
    fn malformed_is_content() {
        for text in [
            r#"[TOOL_CALLS][{"name": "f", "arguments": {"a": }}]"#,
            r#"[TOOL_CALLS][{"arguments": {}}]"#,
            r#"[TOOL_CALLS]f[ARGS]{"a": tru}"#,
            "[TOOL_CALLS]not a call at all",
        ] {
            check(P, text, &Expect::content(text));
        }
    }

    #[test]
    fn unknown_name_is_content() {
        let text = r#"[TOOL_CALLS]rm[ARGS]{}"#;
        check_with(P, Some(&["ls"]), text, &Expect::content(text));
    }

    #[test]
    fn a_stream_cut_inside_a_call_says_so() {
        let text = r#"[TOOL_CALLS]f[ARGS]{"a": "#;
        check(P, text, &Expect::content(text).cut());
        let text = r#"[TOOL_CALLS][{"name": "f", "arguments": {}}"#;
        check(P, text, &Expect::content(text).cut());
    }
}

//! Test harness shared by the parsers' corpora: feed a text whole, one character at a
//! time, split in two at every character boundary, and token by token through a real
//! tokenizer's incremental decoder; every way must give the same result.

use std::sync::OnceLock;

use super::reasoning::reasoning_parser;
use super::tool_calls::{parse_whole, tool_call_parser, ParsedDelta, ToolCall};
use crate::tokenizer::Tokenizer;

/// The model whose tokenizer splits the corpora into tokens.
const MODEL_DIR: &str = "/work/shared/models/tinyllama-chat";

/// What a tool-call parser should make of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Expect {
    content: Option<String>,
    calls: Vec<(String, String)>,
    cut: bool,
}

impl Expect {
    pub(crate) fn calls(calls: &[(&str, &str)]) -> Self {
        Expect { content: None, calls: calls.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect(), cut: false }
    }

    pub(crate) fn content(text: &str) -> Self {
        Expect { content: Some(text.to_string()), calls: Vec::new(), cut: false }
    }

    pub(crate) fn cut(mut self) -> Self {
        self.cut = true;
        self
    }

    pub(crate) fn content_too(mut self, text: &str) -> Self {
        self.content = Some(text.to_string());
        self
    }
}

fn tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| Tokenizer::from_file(format!("{MODEL_DIR}/tokenizer.json")).expect("the test model"))
}

/// `text` as the detokenizer would stream it: one delta per token that completes text.
/// Where the tokenizer does not decode the text back as written (DeepSeek's markers
/// contain `▁`, which a SentencePiece decoder turns into a space), the text is cut at
/// the tokens' offsets instead: the same token boundaries, the exact text.
pub(crate) fn token_deltas(text: &str) -> Vec<String> {
    let tok = tokenizer();
    let ids = tok.encode(text, false).unwrap();
    assert!(ids.len() > 1, "the corpus text is one token");
    let mut decoder = tok.decode_stream(false);
    let mut deltas: Vec<String> = ids.iter().filter_map(|&id| decoder.step(id).unwrap()).collect();
    deltas.extend(decoder.flush().unwrap());
    if deltas.concat() == text {
        return deltas;
    }
    let encoding = tok.hf().encode(text, false).unwrap();
    let mut cuts: Vec<usize> =
        encoding.get_offsets().iter().map(|&(_, end)| end).filter(|&e| text.is_char_boundary(e)).collect();
    cuts.push(text.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut start = 0;
    let deltas: Vec<String> = cuts
        .into_iter()
        .filter(|&end| end > 0)
        .map(|end| {
            let piece = text[start..end].to_string();
            start = end;
            piece
        })
        .collect();
    assert!(deltas.len() > 1 && deltas.concat() == text);
    deltas
}

/// Every way of cutting `text` into deltas that the corpus tests use.
pub(crate) fn splits(text: &str) -> Vec<Vec<String>> {
    let mut all = vec![vec![text.to_string()], text.chars().map(String::from).collect(), token_deltas(text)];
    for (at, _) in text.char_indices().skip(1) {
        all.push(vec![text[..at].to_string(), text[at..].to_string()]);
    }
    all
}

fn feed(parser: &str, tools: Option<&[&str]>, deltas: &[String]) -> Expect {
    let tools = tools.map(|t| t.iter().map(|s| s.to_string()).collect());
    let mut p = tool_call_parser(parser, tools).unwrap();
    let mut all = ParsedDelta::default();
    for d in deltas {
        let out = p.push(d);
        assert!(!out.cut, "only finish says a stream was cut");
        all.content.push_str(&out.content);
        all.calls.extend(out.calls);
    }
    let last = p.finish();
    all.content.push_str(&last.content);
    all.calls.extend(last.calls);
    for (i, call) in all.calls.iter().enumerate() {
        assert_eq!(call.index, i);
        let id = call.id.as_deref().unwrap();
        assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    }
    Expect {
        content: (!all.content.is_empty()).then_some(all.content),
        calls: all.calls.into_iter().map(|c| (c.name.unwrap(), c.arguments)).collect(),
        cut: last.cut,
    }
}

/// Check a tool-call parser (any function allowed) on `text`, fed every way.
pub(crate) fn check(parser: &str, text: &str, expect: &Expect) {
    check_with(parser, None, text, expect);
}

/// Check a tool-call parser allowed only `tools` on `text`, fed every way.
pub(crate) fn check_with(parser: &str, tools: Option<&[&str]>, text: &str, expect: &Expect) {
    for deltas in splits(text) {
        assert_eq!(&feed(parser, tools, &deltas), expect, "{parser} fed {deltas:?}");
    }
    let tools = tools.map(|t| t.iter().map(|s| s.to_string()).collect());
    let (content, calls, cut) = parse_whole(tool_call_parser(parser, tools).unwrap().as_mut(), text);
    let calls: Vec<(String, String)> =
        calls.into_iter().map(|ToolCall { name, arguments, .. }| (name, arguments)).collect();
    assert_eq!(Expect { content, calls, cut }, *expect, "parse_whole");
}

/// Check a reasoning parser on `text`, fed every way: `(reasoning, content)`.
pub(crate) fn check_reasoning(parser: &str, thinking: bool, text: &str, expect: (Option<&str>, Option<&str>)) {
    for deltas in splits(text) {
        let mut p = reasoning_parser(parser, thinking).unwrap();
        let (mut reasoning, mut content) = (String::new(), String::new());
        let mut outs: Vec<_> = deltas.iter().map(|d| p.push(d)).collect();
        outs.push(p.finish());
        for d in outs {
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
        }
        let got = ((!reasoning.is_empty()).then_some(reasoning), (!content.is_empty()).then_some(content));
        assert_eq!((got.0.as_deref(), got.1.as_deref()), expect, "{parser} fed {deltas:?}");
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::{REASONING_PARSERS, TOOL_CALL_PARSERS};
    use super::*;

    /// Pieces that make up outputs with markup in odd places: whole and partial
    /// markers, JSON and Python fragments, quotes, escapes, blanks, non-ASCII text.
    const PIECES: &[&str] = &[
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "{\"name\": \"f\", \"arguments\": {\"a\": 1}}",
        "{",
        "}",
        "[",
        "]",
        "\"",
        "\\",
        ";",
        " ",
        "\n",
        "x",
        "東京🦀",
        "<|python_tag|>",
        "[TOOL_CALLS]",
        "f[ARGS]",
        "(a=1)",
        "f(",
        "'",
        "<think>",
        "</think>",
        "</",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n",
        "\n```<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "[ARGS]",
        "[CALL_ID]",
        "{\"name\": \"f\", \"parameters\": {}}",
        "[f(a='x]'), g()]",
    ];

    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(PIECES), 0..24).prop_map(|p| p.concat())
    }

    fn cut_at(text: &str, cuts: &[usize]) -> Vec<String> {
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let mut at: Vec<usize> = cuts.iter().filter_map(|c| bounds.get(c % bounds.len().max(1)).copied()).collect();
        at.push(0);
        at.push(text.len());
        at.sort_unstable();
        at.dedup();
        at.windows(2).map(|w| text[w[0]..w[1]].to_string()).collect()
    }

    proptest! {
        #[test]
        fn any_split_gives_what_the_whole_text_gives(text in text(), cuts in prop::collection::vec(0usize..512, 0..12)) {
            let deltas = cut_at(&text, &cuts);
            prop_assert_eq!(deltas.concat(), text.clone());
            for parser in TOOL_CALL_PARSERS {
                prop_assert_eq!(feed(parser, None, &deltas), feed(parser, None, std::slice::from_ref(&text)), "{}", parser);
            }
            for parser in REASONING_PARSERS {
                let run = |deltas: &[String]| {
                    let mut p = reasoning_parser(parser, true).unwrap();
                    let mut outs: Vec<_> = deltas.iter().map(|d| p.push(d)).collect();
                    outs.push(p.finish());
                    outs.iter().fold((String::new(), String::new()), |(r, c), d| (r + &d.reasoning, c + &d.content))
                };
                prop_assert_eq!(run(&deltas), run(std::slice::from_ref(&text)), "{}", parser);
            }
        }
    }
}

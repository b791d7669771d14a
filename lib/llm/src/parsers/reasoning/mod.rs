//! Reasoning parsers: split a reasoning model's output into its thinking
//! (`reasoning_content`) and its answer (`content`), incrementally; found by vLLM's
//! `--reasoning-parser` names through [`reasoning_parser`].

mod think_tags;

use super::error::{ParserKind, UnknownParser};

/// The registered reasoning parser names (vLLM's spelling).
pub const REASONING_PARSERS: &[&str] = &["deepseek_r1", "qwen3"];

/// What one [`ReasoningParser::push`] or [`ReasoningParser::finish`] yields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    /// Text for `reasoning_content` (may be empty).
    pub reasoning: String,
    /// Text for `content` (may be empty).
    pub content: String,
}

/// An incremental reasoning parser for one response.
pub trait ReasoningParser: Send {
    /// Feed the next detokenized text delta.
    fn push(&mut self, delta: &str) -> ReasoningDelta;
    /// The stream has ended: release what was held back.
    fn finish(&mut self) -> ReasoningDelta;
}

/// The parser registered as `name`. `thinking`: whether the request lets the model
/// think (Qwen3's `chat_template_kwargs.enable_thinking`; `deepseek_r1` always thinks).
pub fn reasoning_parser(name: &str, thinking: bool) -> Result<Box<dyn ReasoningParser>, UnknownParser> {
    Ok(match name {
        "deepseek_r1" => Box::new(think_tags::ThinkTags::new(true)),
        "qwen3" => Box::new(think_tags::ThinkTags::new(thinking)),
        _ => {
            return Err(UnknownParser { kind: ParserKind::Reasoning, name: name.to_string(), known: REASONING_PARSERS })
        }
    })
}

/// A whole response split at once: `(reasoning, content)`, each `None` when empty.
pub fn parse_whole(parser: &mut dyn ReasoningParser, text: &str) -> (Option<String>, Option<String>) {
    let mut all = parser.push(text);
    let last = parser.finish();
    all.reasoning.push_str(&last.reasoning);
    all.content.push_str(&last.content);
    ((!all.reasoning.is_empty()).then_some(all.reasoning), (!all.content.is_empty()).then_some(all.content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_names_list_the_known_ones() {
        let err = reasoning_parser("r1", true).err().unwrap();
        assert_eq!(err.to_string(), "unknown reasoning parser \"r1\"; known: deepseek_r1, qwen3");
    }
}

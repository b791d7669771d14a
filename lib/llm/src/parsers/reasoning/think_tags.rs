//! `deepseek_r1` and `qwen3`: thinking inside `<think>…</think>`, the answer after.
//! DeepSeek-R1 (and its distills), QwQ and Qwen3. The output may begin inside the
//! block, its `<think>` written by the chat template: the text before `</think>`
//! is reasoning either way. Output with no `</think>` at all is reasoning (a model
//! cut while thinking). With thinking switched off (Qwen3's `enable_thinking:
//! false`) everything is content.

use super::{ReasoningDelta, ReasoningParser};
use crate::parsers::marker::{MarkerSearch, Search};

const START: &str = "<think>";
const END: &str = "</think>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace yet: a `<think>` here opens the block.
    Start,
    Thinking,
    Answer,
}

/// The `<think>` tag parser.
pub(super) struct ThinkTags {
    state: State,
    /// Leading text held while it could still be (the start of) `<think>`.
    lead: String,
    end: MarkerSearch,
}

impl ThinkTags {
    /// `thinking`: whether the output begins in the thinking block.
    pub(super) fn new(thinking: bool) -> Self {
        let state = if thinking { State::Start } else { State::Answer };
        ThinkTags { state, lead: String::new(), end: MarkerSearch::new(&[END]) }
    }

    fn thinking(&mut self, text: &str, out: &mut ReasoningDelta) {
        match self.end.push(text) {
            Search::Pending(safe) => out.reasoning.push_str(&safe),
            Search::Found { before, after, .. } => {
                out.reasoning.push_str(&before);
                out.content.push_str(&after);
                self.state = State::Answer;
            }
        }
    }
}

impl ReasoningParser for ThinkTags {
    fn push(&mut self, delta: &str) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        match self.state {
            State::Answer => out.content.push_str(delta),
            State::Thinking => self.thinking(delta, &mut out),
            State::Start => {
                self.lead.push_str(delta);
                let trimmed = self.lead.trim_start();
                if trimmed.is_empty() || (trimmed.len() < START.len() && START.starts_with(trimmed)) {
                    return out;
                }
                let lead = std::mem::take(&mut self.lead);
                let trimmed = lead.trim_start();
                self.state = State::Thinking;
                let rest = trimmed.strip_prefix(START).unwrap_or(&lead);
                self.thinking(rest, &mut out);
            }
        }
        out
    }

    fn finish(&mut self) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        match self.state {
            State::Start => out.reasoning = std::mem::take(&mut self.lead),
            State::Thinking => out.reasoning = self.end.flush(),
            State::Answer => {}
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::parsers::test_feed::check_reasoning;

    #[test]
    fn think_block_then_answer() {
        for p in ["deepseek_r1", "qwen3"] {
            check_reasoning(
                p,
                true,
                "<think>\nHmm, 2+2.\n</think>\n\nIt is 4.",
                (Some("\nHmm, 2+2.\n"), Some("\n\nIt is 4.")),
            );
        }
    }

    #[test]
    fn output_that_starts_inside_the_block() {
        check_reasoning(
            "deepseek_r1",
            true,
            "Let me think… 東京 🦀</think>Answer",
            (Some("Let me think… 東京 🦀"), Some("Answer")),
        );
    }

    #[test]
    fn cut_while_thinking_is_all_reasoning() {
        check_reasoning("deepseek_r1", true, "<think>still going <", (Some("still going <"), None));
        check_reasoning("deepseek_r1", true, "no tags at all", (Some("no tags at all"), None));
    }

    #[test]
    fn nothing_after_the_block_is_no_content() {
        check_reasoning("qwen3", true, "<think>x</think>", (Some("x"), None));
        check_reasoning("qwen3", true, "<think></think>Hi", (None, Some("Hi")));
    }

    #[test]
    fn thinking_off_is_all_content() {
        check_reasoning("qwen3", false, "Hi <think>not parsed</think>", (None, Some("Hi <think>not parsed</think>")));
    }

    #[test]
    fn a_later_think_tag_is_reasoning_text() {
        check_reasoning("deepseek_r1", true, "a <think> b</think>c", (Some("a <think> b"), Some("c")));
    }
}

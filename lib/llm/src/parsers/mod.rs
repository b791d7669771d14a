//! Output parsers: split a model's detokenized text into content, tool calls and
//! reasoning, incrementally (each delta seen once). One trait per job, one file per
//! format, a registry by vLLM's parser names. See docs/tools.md.

pub mod error;
mod marker;
pub mod reasoning;
#[cfg(test)]
mod test_feed;
pub mod tool_calls;

pub use error::{ParserKind, UnknownParser};
pub use reasoning::{reasoning_parser, ReasoningDelta, ReasoningParser, REASONING_PARSERS};
pub use tool_calls::{tool_call_parser, ParsedDelta, ToolCall, ToolCallDelta, ToolCallParser, TOOL_CALL_PARSERS};

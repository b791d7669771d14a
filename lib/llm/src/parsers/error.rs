//! The one error a parser registry returns: a name it does not know.

use std::fmt;

/// Which registry was asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParserKind {
    /// [`super::tool_call_parser`].
    ToolCall,
    /// [`super::reasoning_parser`].
    Reasoning,
}

impl fmt::Display for ParserKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ParserKind::ToolCall => "tool-call",
            ParserKind::Reasoning => "reasoning",
        })
    }
}

/// A parser name not in the registry; the message lists the known names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {kind} parser {name:?}; known: {}", known.join(", "))]
pub struct UnknownParser {
    /// The registry that was asked.
    pub kind: ParserKind,
    /// The name asked for.
    pub name: String,
    /// The names the registry knows.
    pub known: &'static [&'static str],
}

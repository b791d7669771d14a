//! The step every format starts in: text is content until a call's opening marker,
//! streamed as it comes except for a tail that could be the start of the marker.

use super::emit::CallEmitter;
use crate::parsers::marker::{MarkerSearch, Search};

/// Content up to the first of a format's opening markers.
#[derive(Debug)]
pub(super) struct ContentUntil {
    search: MarkerSearch,
}

impl ContentUntil {
    pub(super) fn new(markers: &'static [&'static str]) -> Self {
        ContentUntil { search: MarkerSearch::new(markers) }
    }

    /// Feed `text`; what is surely content goes to `out` (through `emitter`). Once a
    /// marker is found, returns the text after it, not read yet: the caller goes on
    /// with it in its next state.
    pub(super) fn push(&mut self, text: &str, emitter: &mut CallEmitter, out: &mut String) -> Option<String> {
        if self.search.passes_whole(text) {
            emitter.content(text, out);
            return None;
        }
        match self.search.push(text) {
            Search::Pending(safe) => {
                emitter.content(&safe, out);
                None
            }
            Search::Found { before, after, .. } => {
                emitter.content(&before, out);
                Some(after)
            }
        }
    }

    /// The stream ended here: the held tail was no marker after all; it is content.
    pub(super) fn finish(&mut self, emitter: &mut CallEmitter, out: &mut String) {
        let rest = self.search.flush();
        emitter.content(&rest, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_content_holds_a_partial_marker_and_hands_over_the_rest() {
        let mut emitter = CallEmitter::new(None);
        let mut step = ContentUntil::new(&["<tool_call>"]);
        let mut out = String::new();
        assert_eq!(step.push("Hi <tool_", &mut emitter, &mut out), None);
        assert_eq!(out, "Hi ");
        assert_eq!(step.push("call>{\"a\"", &mut emitter, &mut out), Some("{\"a\"".to_string()));
        assert_eq!(out, "Hi ");

        let mut step = ContentUntil::new(&["<tool_call>"]);
        let mut out = String::new();
        assert_eq!(step.push("a <tool", &mut emitter, &mut out), None);
        step.finish(&mut emitter, &mut out);
        assert_eq!(out, "a <tool");
    }
}

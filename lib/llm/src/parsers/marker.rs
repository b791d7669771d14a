//! Finding markup (`<tool_call>`, `</think>`, ...) in a stream of text deltas without
//! rescanning: only a tail that could be the start of a marker is held back.

/// What [`MarkerSearch::push`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Search {
    /// No marker yet: this text is safe to pass on (a possible marker prefix is held).
    Pending(String),
    /// Marker number `which` found: the text before it, and the text after it (not
    /// searched yet; the caller goes on with it in its next state).
    Found { before: String, which: usize, after: String },
}

/// Searches a stream for the earliest of a few markers.
#[derive(Debug)]
pub(crate) struct MarkerSearch {
    markers: &'static [&'static str],
    /// The markers' first bytes: text without any of them holds no marker, nor the
    /// start of one.
    first_bytes: Vec<u8>,
    /// The tail of the text so far that is a proper prefix of some marker.
    held: String,
}

impl MarkerSearch {
    pub(crate) fn new(markers: &'static [&'static str]) -> Self {
        let first_bytes = markers.iter().filter_map(|m| m.as_bytes().first().copied()).collect();
        MarkerSearch { markers, first_bytes, held: String::new() }
    }

    /// Feed `text`; costs O(len(text) + longest marker).
    pub(crate) fn push(&mut self, text: &str) -> Search {
        if self.passes_whole(text) {
            return Search::Pending(text.to_string());
        }
        let mut s = std::mem::take(&mut self.held);
        s.push_str(text);
        let found = self.markers.iter().enumerate().filter_map(|(i, m)| s.find(m).map(|at| (at, i))).min();
        if let Some((at, which)) = found {
            let after = s[at + self.markers[which].len()..].to_string();
            s.truncate(at);
            return Search::Found { before: s, which, after };
        }
        let keep = self.partial_tail(&s);
        self.held = s[s.len() - keep..].to_string();
        s.truncate(s.len() - keep);
        Search::Pending(s)
    }

    /// Whether `text`, pushed now, would pass on whole (nothing held, and none of its
    /// bytes starts a marker): most deltas are plain words, and this one pass over
    /// their bytes is all they need.
    pub(crate) fn passes_whole(&self, text: &str) -> bool {
        self.held.is_empty() && !text.bytes().any(|b| self.first_bytes.contains(&b))
    }

    /// The held tail, once the stream has ended (it was no marker after all).
    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Bytes at the end of `s` that are a proper prefix of a marker.
    fn partial_tail(&self, s: &str) -> usize {
        let mut best = 0;
        for m in self.markers {
            for k in (1..m.len()).rev() {
                if k <= best {
                    break;
                }
                if m.is_char_boundary(k) && s.ends_with(&m[..k]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_without_a_markers_first_byte_passes_whole() {
        let mut search = MarkerSearch::new(&["<tool_call>", "[TOOL_CALLS]"]);
        assert_eq!(search.push("plain words"), Search::Pending("plain words".into()));
        // After a held prefix, the next plain text completes the check against it.
        assert_eq!(search.push("a <to"), Search::Pending("a ".into()));
        assert_eq!(search.push("day"), Search::Pending("<today".into()));
        let mut none = MarkerSearch::new(&[]);
        assert_eq!(none.push("<x"), Search::Pending("<x".into()));
    }

    #[test]
    fn holds_a_partial_marker_and_finds_it_across_deltas() {
        let mut search = MarkerSearch::new(&["<tool_call>"]);
        assert_eq!(search.push("hi <tool"), Search::Pending("hi ".into()));
        assert_eq!(search.push("_call>{x"), Search::Found { before: String::new(), which: 0, after: "{x".into() });
    }

    #[test]
    fn releases_a_tail_that_turns_out_not_to_be_a_marker() {
        let mut search = MarkerSearch::new(&["</think>"]);
        assert_eq!(search.push("a </"), Search::Pending("a ".into()));
        assert_eq!(search.push("b>"), Search::Pending("</b>".into()));
        assert_eq!(search.push("<"), Search::Pending(String::new()));
        assert_eq!(search.flush(), "<");
    }

    #[test]
    fn the_earliest_of_several_markers_wins() {
        let mut search = MarkerSearch::new(&["[ARGS]", "{"]);
        assert_eq!(search.push("f{[ARGS]"), Search::Found { before: "f".into(), which: 1, after: "[ARGS]".into() });
    }
}

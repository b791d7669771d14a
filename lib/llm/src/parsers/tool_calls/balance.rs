//! Finds where a bracketed value (a JSON object, a Python list) ends in a stream,
//! seeing each character once: nesting depth, strings and escapes.

/// Tracks one bracketed value from its opening bracket.
#[derive(Debug)]
pub(super) struct BracketScanner {
    depth: usize,
    /// The quote of the string we are in.
    quote: Option<char>,
    escaped: bool,
    /// Quote characters of the language (`"` for JSON, also `'` for Python).
    quotes: &'static [char],
}

impl BracketScanner {
    /// A scanner that has not seen the opening bracket yet.
    pub(super) fn new(quotes: &'static [char]) -> Self {
        BracketScanner { depth: 0, quote: None, escaped: false, quotes }
    }

    /// Feed text; returns the byte offset just past the bracket that closes the value.
    pub(super) fn feed(&mut self, text: &str) -> Option<usize> {
        for (at, c) in text.char_indices() {
            if let Some(q) = self.quote {
                if self.escaped {
                    self.escaped = false;
                } else if c == '\\' {
                    self.escaped = true;
                } else if c == q {
                    self.quote = None;
                }
                continue;
            }
            match c {
                '{' | '[' | '(' => self.depth += 1,
                '}' | ']' | ')' => {
                    self.depth = self.depth.saturating_sub(1);
                    if self.depth == 0 {
                        return Some(at + 1);
                    }
                }
                c if self.quotes.contains(&c) => self.quote = Some(c),
                _ => {}
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brackets_in_strings_do_not_count() {
        let mut s = BracketScanner::new(&['"']);
        assert_eq!(s.feed(r#"{"a": "}\"]", "b": [1, {"#), None);
        assert_eq!(s.feed("}]} tail"), Some(3));
    }
}

//! What every format shares on the way out: numbering calls, giving them ids,
//! refusing names outside the request's tools, and content after calls.

use super::ToolCallDelta;

/// Numbers and checks the calls of one response.
#[derive(Debug)]
pub(super) struct CallEmitter {
    allowed: Option<Vec<String>>,
    next_index: usize,
    /// Whitespace after a call, held until non-blank text shows it is content.
    held_blank: String,
}

impl CallEmitter {
    pub(super) fn new(allowed: Option<Vec<String>>) -> Self {
        CallEmitter { allowed, next_index: 0, held_blank: String::new() }
    }

    /// Whether `name` may be called.
    pub(super) fn allows(&self, name: &str) -> bool {
        !name.is_empty() && self.allowed.as_ref().is_none_or(|names| names.iter().any(|n| n == name))
    }

    /// The delta of a complete, checked call.
    pub(super) fn call(&mut self, name: String, arguments: String) -> ToolCallDelta {
        let index = self.next_index;
        self.next_index += 1;
        self.held_blank.clear();
        ToolCallDelta { index, id: Some(new_call_id()), name: Some(name), arguments }
    }

    /// Append content `text` to `out`. Once a call has been emitted, blank text is
    /// held back: whitespace between calls or after the last one is not content.
    pub(super) fn content(&mut self, text: &str, out: &mut String) {
        if self.next_index == 0 {
            out.push_str(text);
            return;
        }
        let body = text.trim_end();
        if body.is_empty() {
            self.held_blank.push_str(text);
            return;
        }
        out.push_str(&self.held_blank);
        self.held_blank.clear();
        out.push_str(body);
        self.held_blank.push_str(&text[body.len()..]);
    }
}

/// `call_` and 24 hex digits, as OpenAI's ids look.
pub(crate) fn new_call_id() -> String {
    let hex = uuid::Uuid::new_v4().simple().to_string();
    format!("call_{}", &hex[..24])
}

//! The `pythonic` format's grammar: a Python list of calls with keyword arguments
//! whose values are literals (strings, numbers, `True`/`False`/`None`, lists, tuples,
//! dicts), turned into JSON text with the keys in the model's order.

/// `[f(a=1), g(b="x")]` → `[("f", "{\"a\": 1}"), ("g", "{\"b\": \"x\"}")]`; `None` when
/// `text` is not such a list.
pub(super) fn parse_calls(text: &str) -> Option<Vec<(String, String)>> {
    let mut p = Reader { chars: text.trim().chars().collect(), at: 0 };
    let calls = p.list_of_calls()?;
    p.ws();
    (p.at == p.chars.len()).then_some(calls)
}

struct Reader {
    chars: Vec<char>,
    at: usize,
}

impl Reader {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn ws(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        let ok = self.peek() == Some(c);
        if ok {
            self.at += 1;
        }
        ok
    }

    /// Items separated by commas (a trailing comma allowed) up to `close`.
    fn items(&mut self, close: char, mut item: impl FnMut(&mut Self) -> Option<()>) -> Option<()> {
        if self.eat(close) {
            return Some(());
        }
        loop {
            item(self)?;
            if self.eat(close) {
                return Some(());
            }
            if !self.eat(',') {
                return None;
            }
            if self.eat(close) {
                return Some(());
            }
        }
    }

    fn list_of_calls(&mut self) -> Option<Vec<(String, String)>> {
        if !self.eat('[') {
            return None;
        }
        let mut calls = Vec::new();
        self.items(']', |p| {
            calls.push(p.call()?);
            Some(())
        })?;
        (!calls.is_empty()).then_some(calls)
    }

    fn ident(&mut self) -> Option<String> {
        self.ws();
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            self.at += 1;
        }
        let ident: String = self.chars[start..self.at].iter().collect();
        (!ident.is_empty() && !ident.starts_with(|c: char| c.is_ascii_digit())).then_some(ident)
    }

    fn call(&mut self) -> Option<(String, String)> {
        let mut name = self.ident()?;
        while self.peek() == Some('.') {
            self.at += 1;
            name.push('.');
            name.push_str(&self.ident()?);
        }
        if !self.eat('(') {
            return None;
        }
        let mut args = Vec::new();
        self.items(')', |p| {
            let key = p.ident()?;
            if !p.eat('=') {
                return None;
            }
            args.push(format!("{}: {}", json_string(&key), p.value()?));
            Some(())
        })?;
        Some((name, format!("{{{}}}", args.join(", "))))
    }

    /// One literal, as JSON text.
    fn value(&mut self) -> Option<String> {
        self.ws();
        match self.peek()? {
            '\'' | '"' => self.string().map(|s| json_string(&s)),
            '[' | '(' => {
                let close = if self.peek() == Some('[') { ']' } else { ')' };
                self.at += 1;
                let mut items = Vec::new();
                self.items(close, |p| {
                    items.push(p.value()?);
                    Some(())
                })?;
                Some(format!("[{}]", items.join(", ")))
            }
            '{' => {
                self.at += 1;
                let mut members = Vec::new();
                self.items('}', |p| {
                    let key = p.value()?;
                    let key = if key.starts_with('"') { key } else { json_string(&key) };
                    if !p.eat(':') {
                        return None;
                    }
                    members.push(format!("{key}: {}", p.value()?));
                    Some(())
                })?;
                Some(format!("{{{}}}", members.join(", ")))
            }
            _ => self.word(),
        }
    }

    /// `True`, `False`, `None` or a number.
    fn word(&mut self) -> Option<String> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_alphanumeric() || "+-._".contains(c)) {
            self.at += 1;
        }
        let word: String = self.chars[start..self.at].iter().filter(|&&c| c != '_').collect();
        match word.as_str() {
            "True" => Some("true".into()),
            "False" => Some("false".into()),
            "None" => Some("null".into()),
            _ if word.parse::<i64>().is_ok() => Some(word.trim_start_matches('+').to_string()),
            _ => {
                let f: f64 = word.parse().ok()?;
                serde_json::Number::from_f64(f).map(|n| n.to_string())
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        let quote = self.peek()?;
        self.at += 1;
        let mut out = String::new();
        loop {
            let c = self.peek()?;
            self.at += 1;
            match c {
                c if c == quote => return Some(out),
                '\\' => {
                    let e = self.peek()?;
                    self.at += 1;
                    match e {
                        'n' => out.push('\n'),
                        't' => out.push('\t'),
                        'r' => out.push('\r'),
                        '0' => out.push('\0'),
                        'x' | 'u' => {
                            let len = if e == 'x' { 2 } else { 4 };
                            let hex: String = self.chars.get(self.at..self.at + len)?.iter().collect();
                            self.at += len;
                            out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                        }
                        '\n' => {}
                        e => out.push(e),
                    }
                }
                c => out.push(c),
            }
        }
    }
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_become_json() {
        let calls = parse_calls(r#"[f(a=1, b='x\'y', c=[1.5, None, True], d={'k': (1, 2)}, e=-3e2), m.g()]"#).unwrap();
        assert_eq!(calls[0].0, "f");
        assert_eq!(calls[0].1, r#"{"a": 1, "b": "x'y", "c": [1.5, null, true], "d": {"k": [1, 2]}, "e": -300.0}"#);
        assert_eq!(calls[1], ("m.g".to_string(), "{}".to_string()));
    }

    #[test]
    fn not_a_list_of_calls_is_none() {
        for text in ["[1, 2]", "[f(1)]", "[f(a=x)]", "[f(a=1)", "[]", "[f(a=1)] extra"] {
            assert_eq!(parse_calls(text), None, "{text}");
        }
    }
}

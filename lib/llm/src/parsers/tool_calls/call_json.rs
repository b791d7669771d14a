//! A call written as a JSON object, `{"name": ..., "arguments": {...}}` (Hermes, Llama
//! 3, Mistral): checked with serde_json, and the arguments' text taken as the model
//! wrote it (serde_json without `preserve_order` would sort the keys).

use serde_json::Value;

/// `(name, arguments)` of a call object; `None` unless `text` is one JSON object with
/// a string `name` and an `arguments` (or `parameters`) value.
pub(super) fn name_and_arguments(text: &str) -> Option<(String, String)> {
    let Value::Object(map) = serde_json::from_str::<Value>(text).ok()? else {
        return None;
    };
    let name = map.get("name")?.as_str()?.to_string();
    let key = if map.contains_key("arguments") { "arguments" } else { "parameters" };
    map.get(key)?;
    let arguments = raw_member(text, key)?.to_string();
    Some((name, arguments))
}

/// The text of the value of top-level member `key` in a valid JSON object (the last
/// one, as serde_json keeps when a key repeats).
pub(super) fn raw_member<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let bytes = text.as_bytes();
    let mut at = skip_ws(bytes, 0);
    if bytes.get(at) != Some(&b'{') {
        return None;
    }
    at += 1;
    let mut found = None;
    loop {
        at = skip_ws(bytes, at);
        if bytes.get(at) == Some(&b'}') {
            return found;
        }
        let key_end = value_end(bytes, at)?;
        let this_key: String = serde_json::from_str(&text[at..key_end]).ok()?;
        at = skip_ws(bytes, key_end);
        if bytes.get(at) != Some(&b':') {
            return None;
        }
        at = skip_ws(bytes, at + 1);
        let end = value_end(bytes, at)?;
        if this_key == key {
            found = Some(text[at..end].trim_end());
        }
        at = skip_ws(bytes, end);
        match bytes.get(at) {
            Some(b',') => at += 1,
            Some(b'}') => return found,
            _ => return None,
        }
    }
}

fn skip_ws(bytes: &[u8], mut at: usize) -> usize {
    while bytes.get(at).is_some_and(u8::is_ascii_whitespace) {
        at += 1;
    }
    at
}

/// The end of the JSON value starting at `at` (the text is known to be valid).
fn value_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate().skip(at) {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' if depth == 0 => return Some(i),
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            b',' if depth == 0 => return Some(i),
            _ => {}
        }
    }
    (depth == 0 && !in_string).then_some(bytes.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_keep_the_models_key_order_and_spacing() {
        let text = r#" {"name": "f", "arguments": {"z": 1, "a": {"b": "}\""}} } "#;
        assert_eq!(name_and_arguments(text), Some(("f".into(), r#"{"z": 1, "a": {"b": "}\""}}"#.into())));
        let text = r#"{"name":"g","parameters":[1,2],"x":true}"#;
        assert_eq!(name_and_arguments(text), Some(("g".into(), "[1,2]".into())));
        let text = r#"{"name":"g","arguments":-1.5e3 }"#;
        assert_eq!(name_and_arguments(text), Some(("g".into(), "-1.5e3".into())));
    }

    #[test]
    fn not_a_call_is_none() {
        for text in
            [r#"{"name": 1, "arguments": {}}"#, r#"{"arguments": {}}"#, r#"{"name": "f"}"#, "[1]", r#"{"name": "f", "#]
        {
            assert_eq!(name_and_arguments(text), None, "{text}");
        }
    }
}

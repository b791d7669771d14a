//! OpenAI `logprobs` objects: built from per-token log probabilities, and merged when
//! chunks are folded into a whole response.
//!
//! - chat: `{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}`
//! - completions: `{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}],
//!   "text_offset": [...]}`

use serde_json::{json, Map, Value};

/// One generated token, its log probability, and the most likely alternatives (the
/// token itself among them when it is one of them).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural-log probability (≤ 0).
    pub logprob: f64,
    /// Alternatives, most likely first.
    pub top: Vec<(String, f64)>,
}

impl TokenLogprob {
    /// A token that was certain (log probability 0), listed as its own top alternative
    /// when `top` > 0 (no other token had any probability).
    pub fn certain(token: String, top: u32) -> Self {
        let alternatives = if top > 0 { vec![(token.clone(), 0.0)] } else { Vec::new() };
        TokenLogprob { token, logprob: 0.0, top: alternatives }
    }
}

/// The chat `logprobs` of `tokens`.
pub fn chat(tokens: Vec<TokenLogprob>) -> Value {
    let content: Vec<Value> = tokens
        .into_iter()
        .map(|t| {
            let top: Vec<Value> = t
                .top
                .iter()
                .map(|(token, logprob)| json!({"token": token, "logprob": logprob, "bytes": token.as_bytes()}))
                .collect();
            json!({"token": t.token, "logprob": t.logprob, "bytes": t.token.as_bytes(), "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// The completions `logprobs` of `tokens`, whose text starts at byte `offset` of the
/// choice's text; also the offset after them.
pub fn completion(tokens: Vec<TokenLogprob>, mut offset: usize) -> (Value, usize) {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut logprobs = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        offsets.push(offset);
        offset += t.token.len();
        let top: Map<String, Value> = t.top.into_iter().map(|(token, lp)| (token, json!(lp))).collect();
        tops.push(Value::Object(top));
        logprobs.push(t.logprob);
        texts.push(t.token);
    }
    let value = json!({"tokens": texts, "token_logprobs": logprobs, "top_logprobs": tops, "text_offset": offsets});
    (value, offset)
}

/// Append the arrays of `more` to those of `into` (either shape: every array field is
/// concatenated).
pub fn merge(into: &mut Option<Value>, more: Option<Value>) {
    let Some(more) = more else { return };
    match into {
        None => *into = Some(more),
        Some(Value::Object(target)) => {
            if let Value::Object(source) = more {
                for (key, value) in source {
                    match (target.get_mut(&key), value) {
                        (Some(Value::Array(a)), Value::Array(b)) => a.extend(b),
                        (_, value) => {
                            target.insert(key, value);
                        }
                    }
                }
            }
        }
        Some(_) => *into = Some(more),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_merging() {
        let a = chat(vec![TokenLogprob::certain("h".into(), 1)]);
        assert_eq!(a["content"][0]["token"], "h");
        assert_eq!(a["content"][0]["top_logprobs"][0]["logprob"], 0.0);
        let mut folded = None;
        merge(&mut folded, Some(a));
        merge(&mut folded, Some(chat(vec![TokenLogprob::certain("i".into(), 0)])));
        assert_eq!(folded.unwrap()["content"].as_array().unwrap().len(), 2);

        let (c, next) = completion(vec![TokenLogprob::certain("ab".into(), 1), TokenLogprob::certain("c".into(), 1)], 3);
        assert_eq!(next, 6);
        assert_eq!(c["text_offset"], json!([3, 5]));
        assert_eq!(c["top_logprobs"][1]["c"], 0.0);
    }
}

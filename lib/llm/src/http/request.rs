//! Reading a request body: size limit, JSON syntax and field types, each failure an
//! OpenAI error that says what is wrong (axum's own extractor rejections are plain
//! text and not OpenAI-shaped).

use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::ApiError;

/// The body, or a 413 (larger than `limit` bytes) / 400 (unreadable) error.
pub(crate) fn body_or_error(body: Result<Bytes, BytesRejection>, limit: usize) -> Result<Bytes, ApiError> {
    body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("the request body is larger than the limit of {limit} bytes")
        } else {
            rejection.body_text()
        };
        ApiError::new(status, message, "invalid_request_error", None)
    })
}

/// Deserialize `body` as `T`; a malformed document or a field of the wrong type is a
/// 400 naming the problem (and the field, in `param`).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner();
        if inner.is_syntax() || inner.is_eof() {
            not_json(inner)
        } else if path == "." || path.is_empty() {
            ApiError::bad_request(format!("invalid request: {inner}"))
        } else {
            ApiError::bad_field(format!("invalid value for '{path}': {inner}"), Some(path))
        }
    })?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

fn not_json(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::ChatCompletionRequest;

    #[test]
    fn errors_say_what_is_wrong() {
        let e = parse_json::<ChatCompletionRequest>(b"{\"model\": ").unwrap_err();
        assert_eq!(e.status.as_u16(), 400);
        assert!(e.body.error.message.contains("not valid JSON"), "{}", e.body.error.message);

        let e = parse_json::<ChatCompletionRequest>(br#"{"model":"m","messages":[],"max_tokens":"ten"}"#).unwrap_err();
        assert!(e.body.error.message.contains("max_tokens"), "{}", e.body.error.message);
        assert_eq!(e.body.error.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.body.error.kind, "invalid_request_error");

        let e = parse_json::<ChatCompletionRequest>(br#"{"messages":[]}"#).unwrap_err();
        assert!(e.body.error.message.contains("model"), "{}", e.body.error.message);

        let e = parse_json::<ChatCompletionRequest>(br#"{"model":"m","messages":[]} trailing"#).unwrap_err();
        assert!(e.body.error.message.contains("not valid JSON"), "{}", e.body.error.message);

        let ok = parse_json::<ChatCompletionRequest>(br#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!(ok.model, "m");
    }
}

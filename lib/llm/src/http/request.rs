//! Reading a request body: size limit, JSON syntax and field types, each failure an
//! OpenAI error that says what is wrong (axum's own extractor rejections are plain
//! text and not OpenAI-shaped).

use std::time::Duration;

use axum::body::Body;
use axum::http::StatusCode;
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::protocols::openai::SamplingParams;

/// The whole body, or 413 (larger than `limit` bytes), 408 (not all there within
/// `timeout`), 400 (the connection failed while reading it).
pub(crate) async fn read_body(body: Body, limit: usize, timeout: Duration) -> Result<Bytes, ApiError> {
    let collect = Limited::new(body, limit).collect();
    match tokio::time::timeout(timeout, collect).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
            "invalid_request_error",
            None,
        )),
        Ok(Err(e)) => Err(ApiError::bad_request(format!("cannot read the request body: {e}"))),
        Err(_) => Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {} s", timeout.as_secs_f64()),
            "invalid_request_error",
            None,
        )),
    }
}

/// Deserialize `body` as `T`; a malformed document or a field of the wrong type is a
/// 400 naming the problem (and the field, in `param`).
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    // The common case without the path tracking; a failure is parsed again to name the field.
    if let Ok(value) = serde_json::from_slice(body) {
        return Ok(value);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize::<_, T>(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.inner();
        if inner.is_syntax() || inner.is_eof() {
            not_json(inner)
        } else if path == "." || path.is_empty() {
            match sampling_field_error(body) {
                Some((field, inner)) => ApiError::bad_field(format!("invalid value for '{field}': {inner}"), Some(field)),
                None => ApiError::bad_request(format!("invalid request: {inner}")),
            }
        } else {
            ApiError::bad_field(format!("invalid value for '{path}': {inner}"), Some(path))
        }
    })?;
    de.end().map_err(|e| not_json(&e))?;
    Ok(value)
}

/// The field and error of a bad sampling field. Those are flattened into both request
/// kinds ([`SamplingParams`]), which serde reads from a buffer where the field's path is
/// lost: read them alone to name the field.
fn sampling_field_error(body: &[u8]) -> Option<(String, String)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let e = serde_path_to_error::deserialize::<_, SamplingParams>(value).err()?;
    let path = e.path().to_string();
    (path != "." && !path.is_empty()).then(|| (path, e.inner().to_string()))
}

fn not_json(e: &serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

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

        // The sampling fields are flattened into both request kinds: still named.
        let e = parse_json::<ChatCompletionRequest>(br#"{"model":"m","messages":[],"temperature":"hot"}"#).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("temperature"), "{}", e.body.error.message);
        let e = parse_json::<CompletionRequest>(br#"{"model":"m","prompt":"x","top_k":"many"}"#).unwrap_err();
        assert_eq!(e.body.error.param.as_deref(), Some("top_k"), "{}", e.body.error.message);

        let ok = parse_json::<ChatCompletionRequest>(br#"{"model":"m","messages":[]}"#).unwrap();
        assert_eq!(ok.model, "m");
    }
}

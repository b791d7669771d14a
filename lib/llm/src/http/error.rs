//! OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}`
//! with the matching status code.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::engine::EngineError;
use crate::protocols::openai::ErrorBody;

/// An error the HTTP service answers with.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// The OpenAI error body.
    pub body: ErrorBody,
}

impl ApiError {
    /// An error with `status`, OpenAI `type` `kind` and optional `code`.
    pub fn new(status: StatusCode, message: impl Into<String>, kind: &str, code: Option<&str>) -> Self {
        ApiError { status, body: ErrorBody::new(message, kind, code) }
    }

    /// 400 `invalid_request_error`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message, "invalid_request_error", None)
    }

    /// 400 `invalid_request_error` naming the offending field in `param`.
    pub fn bad_field(message: impl Into<String>, param: Option<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.body.error.param = param;
        e
    }

    /// 404 `not_found_error` with code `model_not_found`.
    pub fn model_not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message, "not_found_error", Some("model_not_found"))
    }

    /// 503 `service_unavailable`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, message, "service_unavailable", None)
    }

    /// 429 `rate_limit_error` with code `rate_limit_exceeded`: an admission limit of
    /// the model refused the request.
    pub fn rate_limited(message: impl Into<String>) -> Self {
        Self::new(StatusCode::TOO_MANY_REQUESTS, message, "rate_limit_error", Some("rate_limit_exceeded"))
    }

    /// 504 `timeout`: the worker did not answer within a bound.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(StatusCode::GATEWAY_TIMEOUT, message, "timeout", None)
    }

    /// 500 `internal_error`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message, "internal_error", None)
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::BadRequest(m) => ApiError::bad_request(m),
            EngineError::NotFound(m) => ApiError::model_not_found(m),
            EngineError::Unavailable(m) => ApiError::unavailable(m),
            EngineError::Overloaded(m) => ApiError::rate_limited(m),
            EngineError::Timeout(m) => ApiError::timeout(m),
            EngineError::Internal(m) => ApiError::internal(m),
        }
    }
}

impl IntoResponse for ApiError {
    /// A 503 or 429 says when to come back (`Retry-After`): no worker can take the
    /// request now, or the model is at a limit.
    fn into_response(self) -> Response {
        let mut response = (self.status, Json(self.body)).into_response();
        if matches!(self.status, StatusCode::SERVICE_UNAVAILABLE | StatusCode::TOO_MANY_REQUESTS) {
            response.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(super::limits::RETRY_AFTER_SECONDS),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_errors_keep_their_status() {
        for e in [
            EngineError::BadRequest("b".into()),
            EngineError::NotFound("n".into()),
            EngineError::Unavailable("u".into()),
            EngineError::Overloaded("o".into()),
            EngineError::Timeout("t".into()),
            EngineError::Internal("i".into()),
        ] {
            let status = e.status();
            let api = ApiError::from(e);
            assert_eq!(api.status.as_u16(), status);
        }
        let json = serde_json::to_value(ApiError::unavailable("gone").body).unwrap();
        assert_eq!(json["error"]["type"], "service_unavailable");
        assert_eq!(json["error"]["message"], "gone");
    }
}

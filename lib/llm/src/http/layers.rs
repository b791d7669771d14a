//! Middleware of the service: the request id (`x-request-id`, the client's or a new
//! one), the response count by status and the log line of requests that never
//! reached an engine, and the API key check. The cap on generation requests in flight
//! is admission's (`admission.rs`).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use super::state::AppState;

/// The request id header, read from the client and always sent back.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest client-given request id kept; a longer or non-printable one is replaced.
const MAX_REQUEST_ID_LEN: usize = 128;

/// The request's id, as the handlers and logs see it.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub String);

/// Set on a response whose request an engine served: its log line was written by
/// the request's metrics (with tokens and TTFT), not by [`observe`].
#[derive(Debug, Clone, Copy)]
pub(crate) struct EngineLogged;

fn client_request_id(request: &Request) -> Option<String> {
    let value = request.headers().get(&REQUEST_ID)?.to_str().ok()?;
    let ok = !value.is_empty() && value.len() <= MAX_REQUEST_ID_LEN && value.bytes().all(|b| b.is_ascii_graphic());
    ok.then(|| value.to_string())
}

/// Outermost layer: give the request an id, echo it back, count the response by
/// status, and log requests no engine logged.
pub(crate) async fn observe(State(state): State<Arc<AppState>>, mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = client_request_id(&request).unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    let endpoint = request.extensions().get::<MatchedPath>().map_or("unmatched", |p| p.as_str()).to_string();
    let method = request.method().clone();
    request.extensions_mut().insert(RequestId(id.clone()));
    let mut response = next.run(request).await;
    let status = response.status();
    state.metrics.response(&endpoint, status);
    if response.extensions().get::<EngineLogged>().is_none() && endpoint.starts_with("/v1/") {
        tracing::info!(
            request_id = %id,
            %method,
            endpoint,
            status = status.as_u16(),
            duration_ms = started.elapsed().as_millis() as u64,
            "request"
        );
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID.clone(), value);
    }
    response
}

/// Paths any client may read without the API key.
fn is_open_path(path: &str) -> bool {
    matches!(path, "/health" | "/live" | "/ready" | "/metrics")
}

/// Compare without stopping at the first difference, so the time taken says nothing
/// about how much of the key a guess got right.
fn same_key(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && given.iter().zip(expected).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

/// With an API key set: every route but `/health`, `/live`, `/ready` and `/metrics` needs
/// `Authorization: Bearer KEY`; else 401, OpenAI-shaped.
pub(crate) async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let Some(expected) = state.api_key.as_deref() else {
        return next.run(request).await;
    };
    if is_open_path(request.uri().path()) {
        return next.run(request).await;
    }
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(key) if same_key(key.as_bytes(), expected.as_bytes()) => next.run(request).await,
        Some(_) => unauthorized("Incorrect API key provided."),
        None => unauthorized("Missing API key: send it as 'Authorization: Bearer KEY'."),
    }
}

fn unauthorized(message: &str) -> Response {
    ApiError::new(StatusCode::UNAUTHORIZED, message, "invalid_request_error", Some("invalid_api_key")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(same_key(b"abc", b"abc"));
        assert!(!same_key(b"abd", b"abc"));
        assert!(!same_key(b"ab", b"abc"));
    }
}

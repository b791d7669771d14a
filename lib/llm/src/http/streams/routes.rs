//! The HTTP side of resumable streams: a streamed chat or completions request that
//! sends `X-Dynamo-Resumable: true` is detached into the registry;
//! `GET /v1/streams/{request_id}` (after `Last-Event-ID`, or `?after=N`) resumes it and
//! `DELETE /v1/streams/{request_id}` (or `POST /v1/streams/{request_id}/cancel`) aborts
//! it, here or, through the directory, on the frontend that owns it.

use std::convert::Infallible;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};

use super::error::StreamError;
use super::event::EventBody;
use super::proxy;
use crate::http::error::ApiError;
use crate::http::state::AppState;

/// The request header that opts a streamed request into resumption (`true` or `1`).
pub const RESUMABLE_HEADER: HeaderName = HeaderName::from_static("x-dynamo-resumable");
/// Set by a frontend forwarding a resume to the stream's owner: the owner answers from
/// its own registry only.
pub const STREAM_FORWARDED_HEADER: HeaderName = HeaderName::from_static("x-dynamo-stream-forwarded");
const LAST_EVENT_ID: HeaderName = HeaderName::from_static("last-event-id");

/// Whether the request asks for a resumable stream.
pub(crate) fn wants_resume(headers: &HeaderMap) -> bool {
    headers
        .get(&RESUMABLE_HEADER)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

impl StreamError {
    /// The HTTP answer to this error.
    pub(crate) fn to_api_error(&self) -> ApiError {
        let message = self.to_string();
        match self {
            StreamError::NotFound(_) => ApiError::new(StatusCode::NOT_FOUND, message, "not_found_error", Some("stream_not_found")),
            StreamError::Gone { .. } => ApiError::new(StatusCode::GONE, message, "invalid_request_error", Some("stream_gone")),
            StreamError::BeyondEnd { .. } => ApiError::bad_request(message),
            StreamError::AlreadyExists(_) => ApiError::new(StatusCode::CONFLICT, message, "invalid_request_error", Some("stream_exists")),
            StreamError::ShutDown => ApiError::unavailable(message),
        }
    }
}

/// An SSE response of `events` with their ids; a reader that fell behind the buffer
/// gets an error event, then the end.
fn sse_of(events: impl Stream<Item = Result<super::StreamEvent, StreamError>> + Send + 'static) -> Response {
    let events = events.map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(event) => event.to_sse(),
            Err(e) => {
                let body = e.to_api_error().body;
                Event::default().data(serde_json::to_string(&body).unwrap_or_else(|_| "{\"error\":{}}".to_string()))
            }
        })
    });
    let mut response = Sse::new(events).into_response();
    response.headers_mut().insert(RESUMABLE_HEADER, HeaderValue::from_static("true"));
    response
}

/// Detach the events of a streamed response as stream `request_id` and answer with
/// them; the client may drop and resume. On failure the events are dropped (their
/// engine stopped).
pub(crate) fn detach(
    state: &AppState,
    request_id: &str,
    events: impl Stream<Item = EventBody> + Send + 'static,
) -> Response {
    match state.streams.start(request_id, events) {
        Ok(subscription) => sse_of(subscription),
        Err(e) => e.to_api_error().into_response(),
    }
}

/// The query of a resume.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct ResumeQuery {
    /// Resume after this event id (when no `Last-Event-ID` is sent).
    after: Option<u64>,
}

fn cursor(headers: &HeaderMap, query: &ResumeQuery) -> Result<Option<u64>, ApiError> {
    match headers.get(&LAST_EVENT_ID) {
        None => Ok(query.after),
        Some(value) => {
            let text = value.to_str().unwrap_or("").trim();
            text.parse().map(Some).map_err(|_| {
                ApiError::bad_field(format!("Last-Event-ID must be an event id (an integer), got {text:?}"), Some("Last-Event-ID".into()))
            })
        }
    }
}

/// `GET /v1/streams/{request_id}`: the stream's events after the cursor, then live.
pub(crate) async fn resume_stream(
    State(state): State<Arc<AppState>>,
    Path(request_id): Path<String>,
    Query(query): Query<ResumeQuery>,
    headers: HeaderMap,
) -> Response {
    let after = match cursor(&headers, &query) {
        Ok(after) => after,
        Err(e) => return e.into_response(),
    };
    match state.streams.subscribe(&request_id, after) {
        Ok(subscription) => sse_of(subscription),
        Err(StreamError::NotFound(_)) if !headers.contains_key(&STREAM_FORWARDED_HEADER) => {
            forward(&state, Method::GET, &request_id, after, &headers).await
        }
        Err(e) => e.to_api_error().into_response(),
    }
}

/// `DELETE /v1/streams/{request_id}` and `POST /v1/streams/{request_id}/cancel`: abort
/// the stream (its generation stops); 200 with `{"id", "object", "cancelled": true}`.
pub(crate) async fn cancel_stream(
    State(state): State<Arc<AppState>>,
    Path(request_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    match state.streams.cancel(&request_id) {
        Ok(()) => {
            let body = serde_json::json!({"id": request_id, "object": "stream", "cancelled": true});
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Err(StreamError::NotFound(_)) if !headers.contains_key(&STREAM_FORWARDED_HEADER) => {
            forward(&state, Method::DELETE, &request_id, None, &headers).await
        }
        Err(e) => e.to_api_error().into_response(),
    }
}

/// Send a resume or cancel of a stream not held here to its owner, if the directory
/// knows one; 404 otherwise.
async fn forward(state: &AppState, method: Method, request_id: &str, after: Option<u64>, headers: &HeaderMap) -> Response {
    let owner = match state.streams.owner_of(request_id).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return StreamError::NotFound(request_id.to_string()).to_api_error().into_response(),
        Err(e) => return ApiError::unavailable(e.to_string()).into_response(),
    };
    let path = match after {
        Some(after) => format!("/v1/streams/{}?after={after}", proxy::encode_segment(request_id)),
        None => format!("/v1/streams/{}", proxy::encode_segment(request_id)),
    };
    let authorization = headers.get(axum::http::header::AUTHORIZATION).cloned();
    match proxy::forward(&state.streams, &owner, method, &path, authorization).await {
        Ok(response) => response,
        Err(e) => ApiError::unavailable(format!("the frontend {owner} that owns stream {request_id:?} cannot be reached: {e}")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_comes_from_last_event_id_then_after() {
        let mut headers = HeaderMap::new();
        assert_eq!(cursor(&headers, &ResumeQuery { after: None }).unwrap(), None);
        assert_eq!(cursor(&headers, &ResumeQuery { after: Some(4) }).unwrap(), Some(4));
        headers.insert(LAST_EVENT_ID, HeaderValue::from_static("7"));
        assert_eq!(cursor(&headers, &ResumeQuery { after: Some(4) }).unwrap(), Some(7));
        headers.insert(LAST_EVENT_ID, HeaderValue::from_static("x"));
        assert_eq!(cursor(&headers, &ResumeQuery { after: None }).unwrap_err().status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn opt_in_is_true_or_1() {
        let mut headers = HeaderMap::new();
        assert!(!wants_resume(&headers));
        for (value, wanted) in [("true", true), ("TRUE", true), ("1", true), ("false", false), ("yes", false)] {
            headers.insert(RESUMABLE_HEADER, HeaderValue::from_static(value));
            assert_eq!(wants_resume(&headers), wanted, "{value}");
        }
    }
}

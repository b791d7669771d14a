//! The routes of `/v1/responses`: create (whole, streamed as SSE, or in the
//! background), retrieve, list input items, delete and cancel.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Extension, Path, Query, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::{Stream, StreamExt};

use super::{background, convert, input, input_items};
use super::events::StreamEvent;
use super::generation::{Generation, Saver};
use super::protocol::{CreateRequest, Deleted, ResponseObject};
use super::store::{StoreError, StoreErrorKind, StoredResponse};
use crate::engine::{EngineError, RequestContext};
use crate::admission::{ticketed, with_ticket};
use crate::http::admission::{refusal_response, InflightSlot};
use crate::http::error::ApiError;
use crate::http::guard::CancelOnDrop;
use crate::http::layers::{EngineLogged, RequestId};
use crate::http::request::{parse_json, read_body};
use crate::http::state::AppState;
use crate::http::streams::{proxy, StreamError, Subscription, STREAM_FORWARDED_HEADER};
use crate::model_manager::EngineKind;

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e.kind {
            StoreErrorKind::Backend => ApiError::unavailable(e.to_string()),
            StoreErrorKind::Corrupt => ApiError::internal(e.to_string()),
        }
    }
}

/// Bound on waiting for a cancelled background response to be saved as ended.
const CANCEL_BOUND: std::time::Duration = std::time::Duration::from_secs(5);
const CANCEL_POLL: std::time::Duration = std::time::Duration::from_millis(20);

fn not_found(id: &str) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("no response with id '{id}'"), "invalid_request_error", None)
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    State(state): State<Arc<AppState>>,
    Extension(id): Extension<RequestId>,
    slot: Option<Extension<InflightSlot>>,
    body: Body,
) -> Response {
    let slot = slot.map(|Extension(s)| s);
    let mut response = match create_inner(state, id, slot, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    response.extensions_mut().insert(EngineLogged);
    response
}

async fn create_inner(
    state: Arc<AppState>,
    request_id: RequestId,
    slot: Option<InflightSlot>,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(body, state.body_limit, state.limits.body_timeout).await?;
    let request: CreateRequest = parse_json(&bytes)?;
    convert::check_supported(&request)?;
    let engine = state.manager.chat_engine(&request.model)?;
    let ticket = match state.admission.admit(&request.model) {
        Ok(t) => t,
        Err(refusal) => return Ok(refusal_response(refusal, state.manager.is_routable(&request.model))),
    };
    let mut conversation = match &request.previous_response_id {
        Some(previous) => {
            let stored = state.responses.get(previous).await?.ok_or_else(|| {
                let mut e = not_found(previous);
                e.body.error.param = Some("previous_response_id".to_string());
                e
            })?;
            input::conversation_after(&stored.input, &stored.response)?
        }
        None => Vec::new(),
    };
    conversation.extend(input::input_messages(&request.input)?);
    let chat = convert::chat_request(&request, &conversation, state.limits.default_max_tokens)?;

    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let response = convert::response_for(&request, &id);
    let ctx = RequestContext::new(id.clone());
    let guard = CancelOnDrop::new(ctx.clone());
    let metrics = state.metrics.start(&request_id.0, &request.model, EngineKind::Chat, request.stream);
    let saver = response.store.then(|| Saver {
        store: state.responses.clone(),
        input: conversation,
        input_items: input_items::listed_items(&request.input),
    });
    let shutdown = state.shutdown.clone();
    let stream = tokio::select! {
        // The stream holds the request's admission share and its global slot until its
        // generation ends (a background one's too).
        s = with_ticket(ticket.clone(), engine.chat(chat, ctx)) => InflightSlot::hold(slot, ticketed(s?, ticket.clone())),
        _ = shutdown.cancelled() => return Err(ApiError::unavailable("the server is shutting down")),
    };
    state.admission.admitted(&ticket);
    let mut generation = Generation::new(response.clone(), stream, guard, metrics, shutdown, saver);
    if request.background {
        // Saved as queued first, so that a GET right after this answer finds it.
        generation.save().await?;
        let (cancel, registration) = state.background.register(&id);
        let events = background::events(generation, cancel, registration);
        let holder = state.streams.start(id.clone(), events).map_err(|e| e.to_api_error())?;
        let client = if request.stream { Some(state.streams.subscribe(&id, None).map_err(|e| e.to_api_error())?) } else { None };
        let (streams, store) = (state.streams.clone(), state.responses.clone());
        state.streams.track(move |shutdown| background::hold(holder, shutdown, streams, store));
        return Ok(match client {
            Some(subscription) => replay(subscription),
            None => Json(response).into_response(),
        });
    }
    let mut generation = generation.prime().await?;
    if request.stream {
        return Ok(Sse::new(sse_events(generation)).into_response());
    }
    while generation.next().await.is_some() {}
    if let Some(e) = generation.error() {
        return Err(ApiError::from(e.clone()));
    }
    Ok(Json(generation.response().clone()).into_response())
}

fn sse_event(event: &StreamEvent) -> Event {
    let data = serde_json::to_string(event).unwrap_or_else(|e| {
        let error = EngineError::Internal(format!("cannot serialize an event: {e}"));
        format!("{{\"type\":\"error\",\"message\":{:?},\"sequence_number\":{}}}", error.to_string(), event.sequence_number)
    });
    Event::default().event(event.name()).data(data)
}

/// The response's events as SSE; dropping the body (the client left) stops the engine.
fn sse_events(generation: Generation) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    futures::stream::unfold(generation, |mut g| async move {
        let events = g.next().await?;
        Some((futures::stream::iter(events.iter().map(sse_event).map(Ok).collect::<Vec<_>>()), g))
    })
    .flatten()
}

/// Query of `GET /v1/responses/{id}`.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct RetrieveQuery {
    #[serde(default)]
    stream: Option<bool>,
    /// With `stream=true`: the events after this `sequence_number`.
    #[serde(default)]
    starting_after: Option<u64>,
}

/// `GET /v1/responses/{id}`: the stored response, or with `stream=true` the events of a
/// background response this frontend generates (after `starting_after`), then live.
pub(crate) async fn retrieve(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<RetrieveQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    if query.stream == Some(true) {
        return match state.streams.subscribe(&id, query.starting_after) {
            Ok(subscription) => Ok(replay(subscription)),
            Err(StreamError::NotFound(_)) => {
                let Some(owner) = owner(&state, &id, &headers).await? else {
                    return Err(ApiError::new(
                        StatusCode::NOT_FOUND,
                        format!(
                            "no events of response '{id}' are kept: only a background response's are, by the \
                             frontend generating it, until its stream's retention passes"
                        ),
                        "invalid_request_error",
                        None,
                    ));
                };
                let path = match query.starting_after {
                    Some(after) => format!("/v1/responses/{id}?stream=true&starting_after={after}"),
                    None => format!("/v1/responses/{id}?stream=true"),
                };
                forward(&state, &owner, Method::GET, &path, &headers).await
            }
            Err(e) => Err(e.to_api_error()),
        };
    }
    let stored = state.responses.get(&id).await?.ok_or_else(|| not_found(&id))?;
    Ok(Json(stored.response).into_response())
}

/// A background response's events as SSE (with `id:` lines, the `sequence_number`s); a
/// reader behind the replay buffer gets an `error` event, then the end.
fn replay(subscription: Subscription) -> Response {
    let events = subscription.map(|item| {
        Ok::<_, Infallible>(match item {
            Ok(event) => event.to_sse(),
            Err(e) => {
                let error = serde_json::json!({"type": "error", "message": e.to_string(), "code": null, "param": null});
                Event::default().event("error").data(error.to_string())
            }
        })
    });
    Sse::new(events).into_response()
}

/// `GET /v1/responses/{id}/input_items`: a page of the stored response's input items.
pub(crate) async fn list_input_items(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    Query(query): Query<input_items::ItemsQuery>,
) -> Result<Json<input_items::ItemList>, ApiError> {
    let stored = state.responses.get(&id).await?.ok_or_else(|| not_found(&id))?;
    Ok(Json(input_items::page(&stored.input_items, &query)?))
}

/// `DELETE /v1/responses/{id}` (a background response generating here is cancelled).
pub(crate) async fn delete(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Result<Json<Deleted>, ApiError> {
    if state.background.cancel(&id) {
        wait_until_ended(&state, &id).await?;
    }
    if !state.responses.delete(&id).await? {
        return Err(not_found(&id));
    }
    Ok(Json(Deleted { id, object: "response.deleted", deleted: true }))
}

/// `POST /v1/responses/{id}/cancel`: only a background response can be cancelled; one
/// that already ended is returned as it is.
pub(crate) async fn cancel(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let stored = state.responses.get(&id).await?.ok_or_else(|| not_found(&id))?;
    if !stored.response.background {
        return Err(ApiError::bad_request(format!("response '{id}' is not a background response: only those can be cancelled")));
    }
    if stored.response.status.is_terminal() {
        return Ok(Json(stored.response).into_response());
    }
    if state.background.cancel(&id) {
        return Ok(Json(wait_until_ended(&state, &id).await?).into_response());
    }
    // Generated by another frontend: the one that announced the response's stream.
    match owner(&state, &id, &headers).await? {
        Some(owner) => forward(&state, &owner, Method::POST, &format!("/v1/responses/{id}/cancel"), &headers).await,
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("response '{id}' is generated by a frontend that cannot be found (it may have stopped)"),
            "invalid_request_error",
            None,
        )),
    }
}

/// The frontend (`host:port`) that generates background response `id`, when it is not
/// this one and the request was not already forwarded here.
async fn owner(state: &AppState, id: &str, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if headers.contains_key(&STREAM_FORWARDED_HEADER) {
        return Ok(None);
    }
    state.streams.owner_of(id).await.map_err(|e| ApiError::unavailable(e.to_string()))
}

/// Send `method path` to the frontend `owner` and answer with its response.
async fn forward(state: &AppState, owner: &str, method: Method, path: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let authorization = headers.get(axum::http::header::AUTHORIZATION).cloned();
    proxy::forward(&state.streams, owner, method, path, authorization)
        .await
        .map_err(|e| ApiError::unavailable(format!("the frontend {owner} generating this response cannot be reached: {e}")))
}

/// Poll the store until response `id` has ended (its producer saves it when it stops),
/// within [`CANCEL_BOUND`].
async fn wait_until_ended(state: &AppState, id: &str) -> Result<ResponseObject, ApiError> {
    let deadline = tokio::time::Instant::now() + CANCEL_BOUND;
    loop {
        let stored: StoredResponse = state.responses.get(id).await?.ok_or_else(|| not_found(id))?;
        if stored.response.status.is_terminal() {
            return Ok(stored.response);
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(ApiError::timeout(format!("response '{id}' did not stop within {CANCEL_BOUND:?}")));
        }
        tokio::time::sleep(CANCEL_POLL).await;
    }
}

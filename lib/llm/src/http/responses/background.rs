//! Background responses (`background: true`): the response's events are a producer
//! detached into the resumable-stream registry (`http/streams`), so that a client can
//! read them (`stream: true`, or later `GET /v1/responses/{id}?stream=true&starting_after=N`)
//! while nobody needs to; a holder on the registry's tracker reads them to the end, so
//! the stream's grace period never stops a response that has no client. The producer
//! saves the response's progress to the store as it goes (at most every
//! [`SAVE_EVERY`]) and ends it as `cancelled` when [`BackgroundCancels::cancel`] asks;
//! a frontend that shuts down saves its unfinished ones as `failed`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use super::events::StreamEvent;
use super::generation::Generation;
use super::protocol::{ResponseError, Status};
use super::store::SharedResponseStore;
use crate::http::streams::{EventBody, StreamRegistry, Subscription};

/// How often a background response's progress is written to the store.
pub(crate) const SAVE_EVERY: Duration = Duration::from_millis(200);

/// The cancel tokens of the background responses this frontend generates.
#[derive(Default)]
pub(crate) struct BackgroundCancels {
    tokens: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

/// Forgets a response's cancel token when its producer ends or is dropped.
pub(crate) struct Registration {
    id: String,
    tokens: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.tokens.lock().remove(&self.id);
    }
}

impl BackgroundCancels {
    /// A cancel token for response `id`, held until the registration is dropped.
    pub(crate) fn register(&self, id: &str) -> (CancellationToken, Registration) {
        let token = CancellationToken::new();
        self.tokens.lock().insert(id.to_string(), token.clone());
        (token, Registration { id: id.to_string(), tokens: self.tokens.clone() })
    }

    /// Ask response `id` to stop; whether this frontend generates it.
    pub(crate) fn cancel(&self, id: &str) -> bool {
        match self.tokens.lock().get(id) {
            Some(token) => {
                token.cancel();
                true
            }
            None => false,
        }
    }
}

/// The producer's state.
struct Producer {
    generation: Generation,
    cancel: CancellationToken,
    last_save: Instant,
    done: bool,
    _registration: Registration,
}

fn body(event: &StreamEvent) -> EventBody {
    let data = serde_json::to_string(event).unwrap_or_else(|e| {
        format!("{{\"type\":\"error\",\"message\":{:?},\"sequence_number\":{}}}", e.to_string(), event.sequence_number)
    });
    EventBody::named(event.name(), data)
}

/// The events of a background `generation` as SSE bodies, in sequence order (so the
/// registry's event ids are their `sequence_number`s); saving progress as they go.
pub(crate) fn events(
    generation: Generation,
    cancel: CancellationToken,
    registration: Registration,
) -> impl Stream<Item = EventBody> + Send {
    let producer = Producer { generation, cancel, last_save: Instant::now(), done: false, _registration: registration };
    futures::stream::unfold(producer, |mut p| async move {
        if p.done {
            return None;
        }
        let events = tokio::select! {
            biased;
            _ = p.cancel.cancelled() => {
                p.done = true;
                p.generation.cancel().await
            }
            events = p.generation.next() => match events {
                None => return None,
                Some(events) => events,
            },
        };
        if !p.done && p.last_save.elapsed() >= SAVE_EVERY {
            p.last_save = Instant::now();
            if let Err(e) = p.generation.save().await {
                tracing::warn!(response = %p.generation.response().id, error = %e, "cannot save progress");
            }
        }
        let bodies: Vec<EventBody> = events.iter().map(body).collect();
        Some((futures::stream::iter(bodies), p))
    })
    .flatten()
}

/// Bound on waiting, at shutdown, for the registry to drop a background producer.
const PRODUCER_GONE_BOUND: Duration = Duration::from_secs(1);

/// Read `subscription` to its end, so that the stream always has a reader. If the
/// response is not saved as ended then (the frontend shut down, `shutdown`, or its stream
/// was cancelled through `/v1/streams`), wait (bounded) for the producer to be dropped
/// and save it as `failed`, so that no reader waits for it.
pub(crate) async fn hold(subscription: Subscription, shutdown: CancellationToken, streams: StreamRegistry, store: SharedResponseStore) {
    let id = subscription.request_id().to_string();
    tokio::select! {
        () = subscription.for_each(|_| async {}) => {}
        _ = shutdown.cancelled() => {}
    }
    let deadline = Instant::now() + PRODUCER_GONE_BOUND;
    while streams.contains(&id) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut stored = match store.get(&id).await {
        Ok(Some(stored)) if !stored.response.status.is_terminal() => stored,
        Ok(_) => return,
        Err(e) => {
            tracing::warn!(response = %id, error = %e, "cannot read a background response at its end");
            return;
        }
    };
    let why = if shutdown.is_cancelled() { "the frontend generating it shut down" } else { "its stream was cancelled" };
    stored.response.status = Status::Failed;
    stored.response.error = Some(ResponseError { code: "server_error".to_string(), message: why.to_string() });
    if let Err(e) = store.put(stored).await {
        tracing::warn!(response = %id, error = %e, "cannot save a stopped background response");
    }
}

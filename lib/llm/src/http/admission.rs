//! The HTTP side of admission control (the decisions and tickets are
//! [`crate::admission`]): the global cap on generation requests in flight (a
//! middleware answering 503), the response to a model's refusal (429, or 503 when no
//! worker serves the model), and a response body that holds a share — an in-flight
//! slot, a ticket — until it is done or dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::connections::overloaded;
use super::error::ApiError;
use crate::admission::{Admission, Refusal};

/// The answer to a refused request: 429 `rate_limit_exceeded` with `Retry-After`, or
/// 503 when no worker can serve the model at all (more load would not be the cause).
pub(crate) fn refusal_response(refusal: Refusal, routable: bool) -> Response {
    if !routable {
        return overloaded(&format!("{refusal}; no worker serves the model now"));
    }
    axum::response::IntoResponse::into_response(ApiError::rate_limited(refusal.message))
}

/// The global cap and its refusal count.
#[derive(Clone)]
pub(crate) struct GlobalCap {
    /// Slots of generation requests in flight.
    pub slots: Arc<Semaphore>,
    /// Counts refusals.
    pub admission: Arc<Admission>,
}

/// A request's slot under the global cap. The response body holds it and so may the
/// engine stream (a request extension hands it to the handler): the slot is free when
/// both are gone, so a generation that outlives its client (a detached resumable
/// stream, a background response) keeps counting until it ends.
#[derive(Clone)]
pub(crate) struct InflightSlot {
    _permit: Arc<OwnedSemaphorePermit>,
}

impl InflightSlot {
    /// `stream`, holding `slot` (if the route has one) until the stream is dropped.
    pub(crate) fn hold<T: Send + 'static>(slot: Option<Self>, stream: BoxStream<'static, T>) -> BoxStream<'static, T> {
        match slot {
            Some(slot) => stream
                .map(move |item| {
                    let _held = &slot;
                    item
                })
                .boxed(),
            None => stream,
        }
    }
}

/// Cap generation requests in flight: past `max_inflight`, 503 with `Retry-After`.
/// The slot is held until the response body (a stream, too) is done or dropped, and
/// until the engine stream the handler built is dropped ([`InflightSlot`]).
pub(crate) async fn limit_inflight(State(cap): State<GlobalCap>, mut request: Request, next: Next) -> Response {
    let Ok(permit) = cap.slots.clone().try_acquire_owned() else {
        cap.admission.refuse_global();
        return overloaded("too many requests in flight; retry later");
    };
    let slot = InflightSlot { _permit: Arc::new(permit) };
    request.extensions_mut().insert(slot.clone());
    hold_until_done(next.run(request).await, slot)
}

/// `response` with `held` kept until its body is done or dropped.
pub(crate) fn hold_until_done<T: Send + Sync + Unpin + 'static>(response: Response, held: T) -> Response {
    let (parts, body) = response.into_parts();
    Response::from_parts(parts, Body::new(Holding { inner: body, _held: held }))
}

/// A response body that holds something (an in-flight slot, a ticket) until it is
/// done or dropped; sizes pass through (a whole response keeps its `Content-Length`).
struct Holding<T> {
    inner: Body,
    _held: T,
}

impl<T: Send + Sync + Unpin + 'static> hyper::body::Body for Holding<T> {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

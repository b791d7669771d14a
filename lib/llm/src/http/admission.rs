//! Admission control: the one place where the frontend refuses generation requests
//! for load. The global cap on requests in flight (503), and each model's limits on
//! requests in flight and on queued prompt tokens (429). Every refusal is answered at once with `Retry-After`; nothing waits
//! for room.
//!
//! A request's share is a [`Ticket`]: taken before the engine is called, charged with
//! the prompt's tokens once the pipeline has tokenized it ([`charge_prompt_tokens`],
//! through a task-local scope around the engine call), relieved of them at the first
//! item, and released entirely when the response body ends or is dropped (a client
//! that goes away, a failed or refused request): nothing is left counted.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use bytes::Bytes;
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};
use tokio::sync::Semaphore;

use super::connections::overloaded;
use super::error::ApiError;
use super::limits::AdmissionLimits;
use super::metrics::METRICS_PREFIX;
use crate::engine::EngineError;

/// The `model` label of refusals by the global cap, which come before the body is read.
const ANY_MODEL: &str = "*";

/// Which limit refused a request (the `reason` label of the refusal counter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RefusalReason {
    /// The global cap on generation requests in flight (503).
    GlobalInflight,
    /// The model's limit on requests in flight (429).
    InflightRequests,
    /// The model's limit on queued prompt tokens (429).
    QueuedTokens,
}

impl RefusalReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefusalReason::GlobalInflight => "global_inflight",
            RefusalReason::InflightRequests => "inflight_requests",
            RefusalReason::QueuedTokens => "queued_tokens",
        }
    }
}

/// A request refused by a limit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub(crate) struct Refusal {
    /// The limit.
    pub reason: RefusalReason,
    /// What the client reads.
    pub message: String,
}

impl From<Refusal> for EngineError {
    fn from(r: Refusal) -> Self {
        EngineError::Overloaded(r.message)
    }
}

/// The admission counters in `/metrics`.
#[derive(Clone)]
struct AdmissionMetrics {
    admitted: IntCounterVec,
    rejected: IntCounterVec,
    queued_tokens: IntGaugeVec,
    inflight: IntGaugeVec,
}

impl AdmissionMetrics {
    fn new(registry: &Registry) -> prometheus::Result<Self> {
        let admitted = IntCounterVec::new(
            Opts::new(format!("{METRICS_PREFIX}_admission_admitted_total"), "Requests admitted and handed to an engine"),
            &["model"],
        )?;
        let rejected = IntCounterVec::new(
            Opts::new(format!("{METRICS_PREFIX}_admission_rejected_total"), "Requests refused by a limit, by reason"),
            &["model", "reason"],
        )?;
        let queued_tokens = IntGaugeVec::new(
            Opts::new(
                format!("{METRICS_PREFIX}_admission_queued_tokens"),
                "Prompt tokens of admitted requests that have no first token yet",
            ),
            &["model"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new(format!("{METRICS_PREFIX}_admission_inflight_requests"), "Requests holding an admission ticket"),
            &["model"],
        )?;
        registry.register(Box::new(admitted.clone()))?;
        registry.register(Box::new(rejected.clone()))?;
        registry.register(Box::new(queued_tokens.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        Ok(AdmissionMetrics { admitted, rejected, queued_tokens, inflight })
    }
}

/// One model's counts.
#[derive(Debug, Default)]
struct Counts {
    inflight: usize,
    queued_tokens: u64,
}

/// Admission state of every model a frontend served.
pub(crate) struct Admission {
    limits: AdmissionLimits,
    models: Mutex<HashMap<String, Arc<Mutex<Counts>>>>,
    metrics: AdmissionMetrics,
}

impl std::fmt::Debug for Admission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admission").field("limits", &self.limits).finish()
    }
}

impl Admission {
    /// Admission with `limits`, its counters registered in `registry`.
    pub(crate) fn new(limits: AdmissionLimits, registry: &Registry) -> prometheus::Result<Self> {
        Ok(Admission { limits, models: Mutex::new(HashMap::new()), metrics: AdmissionMetrics::new(registry)? })
    }

    /// A refusal by the global cap, counted.
    pub(crate) fn refuse_global(&self) {
        self.metrics.rejected.with_label_values(&[ANY_MODEL, RefusalReason::GlobalInflight.as_str()]).inc();
    }

    /// A ticket for a request to `model`, or the refusal (counted) when the model
    /// already has its most requests in flight.
    pub(crate) fn admit(&self, model: &str) -> Result<Arc<Ticket>, Refusal> {
        let counts = self.models.lock().entry(model.to_string()).or_default().clone();
        {
            let mut c = counts.lock();
            if let Some(max) = self.limits.max_inflight_requests {
                if c.inflight >= max {
                    drop(c);
                    return Err(self.refused(
                        model,
                        RefusalReason::InflightRequests,
                        format!("model '{model}' has {max} requests in flight, its limit; retry later"),
                    ));
                }
            }
            c.inflight += 1;
        }
        self.metrics.inflight.with_label_values(&[model]).inc();
        Ok(Arc::new(Ticket {
            model: model.to_string(),
            counts,
            limits: self.limits.clone(),
            metrics: self.metrics.clone(),
            charged: Mutex::new(0),
        }))
    }

    /// The request of `ticket` reached its engine.
    pub(crate) fn admitted(&self, ticket: &Ticket) {
        self.metrics.admitted.with_label_values(&[&ticket.model]).inc();
    }

    fn refused(&self, model: &str, reason: RefusalReason, message: String) -> Refusal {
        self.metrics.rejected.with_label_values(&[model, reason.as_str()]).inc();
        Refusal { reason, message }
    }

    /// Requests of `model` holding a ticket now.
    #[cfg(test)]
    fn inflight(&self, model: &str) -> usize {
        self.models.lock().get(model).map_or(0, |c| c.lock().inflight)
    }

    /// Queued prompt tokens of `model` now.
    #[cfg(test)]
    fn queued_tokens(&self, model: &str) -> u64 {
        self.models.lock().get(model).map_or(0, |c| c.lock().queued_tokens)
    }
}

/// One admitted request's share of its model's limits; released when dropped.
pub(crate) struct Ticket {
    model: String,
    counts: Arc<Mutex<Counts>>,
    limits: AdmissionLimits,
    metrics: AdmissionMetrics,
    /// Prompt tokens this request holds among its model's queued tokens.
    charged: Mutex<u64>,
}

impl Ticket {
    /// Count `tokens` more prompt tokens as queued, or refuse (counted) when that would
    /// take the model past its limit. A prompt alone over the limit is admitted when
    /// nothing else is queued, so that a long prompt is slow, not refused forever.
    pub(crate) fn charge(&self, tokens: u64) -> Result<(), Refusal> {
        {
            let mut c = self.counts.lock();
            if let Some(max) = self.limits.max_queued_tokens {
                if c.queued_tokens > 0 && c.queued_tokens.saturating_add(tokens) > max {
                    let queued = c.queued_tokens;
                    drop(c);
                    return Err(self.refused(
                        RefusalReason::QueuedTokens,
                        format!(
                            "model '{}' has {queued} prompt tokens queued; {tokens} more would pass its limit of {max}; retry later",
                            self.model
                        ),
                    ));
                }
            }
            c.queued_tokens = c.queued_tokens.saturating_add(tokens);
        }
        *self.charged.lock() += tokens;
        self.metrics.queued_tokens.with_label_values(&[&self.model]).add(clamp(tokens));
        Ok(())
    }

    /// The request produced its first item: its prompt tokens are no longer queued.
    pub(crate) fn first_token(&self) {
        let tokens = std::mem::take(&mut *self.charged.lock());
        if tokens > 0 {
            let mut c = self.counts.lock();
            c.queued_tokens = c.queued_tokens.saturating_sub(tokens);
            drop(c);
            self.metrics.queued_tokens.with_label_values(&[&self.model]).sub(clamp(tokens));
        }
    }

    fn refused(&self, reason: RefusalReason, message: String) -> Refusal {
        self.metrics.rejected.with_label_values(&[&self.model, reason.as_str()]).inc();
        Refusal { reason, message }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.first_token();
        self.counts.lock().inflight -= 1;
        self.metrics.inflight.with_label_values(&[&self.model]).dec();
    }
}

fn clamp(tokens: u64) -> i64 {
    i64::try_from(tokens).unwrap_or(i64::MAX)
}

tokio::task_local! {
    /// The ticket of the request whose engine call is running in this task.
    static CURRENT: Arc<Ticket>;
}

/// Run an engine call with `ticket` as the request's ticket: the pipeline charges the
/// prompt to it.
pub(crate) async fn with_ticket<F: Future>(ticket: Arc<Ticket>, call: F) -> F::Output {
    CURRENT.scope(ticket, call).await
}

/// Count a tokenized prompt as queued on the current request's ticket; no effect
/// outside an admitted HTTP request (text and batch inputs, tests).
pub(crate) fn charge_prompt_tokens(tokens: usize) -> Result<(), EngineError> {
    CURRENT.try_with(|t| t.charge(tokens as u64)).unwrap_or(Ok(())).map_err(EngineError::from)
}

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

/// Cap generation requests in flight: past `max_inflight`, 503 with `Retry-After`.
/// The slot is held until the response body (a stream, too) is done or dropped.
pub(crate) async fn limit_inflight(State(cap): State<GlobalCap>, request: Request, next: Next) -> Response {
    let Ok(slot) = cap.slots.clone().try_acquire_owned() else {
        cap.admission.refuse_global();
        return overloaded("too many requests in flight; retry later");
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(limits: AdmissionLimits) -> (Admission, Registry) {
        let registry = Registry::new();
        (Admission::new(limits, &registry).unwrap(), registry)
    }

    fn rejected(a: &Admission, model: &str, reason: RefusalReason) -> u64 {
        a.metrics.rejected.with_label_values(&[model, reason.as_str()]).get()
    }

    fn queued_gauge(a: &Admission, model: &str) -> i64 {
        a.metrics.queued_tokens.with_label_values(&[model]).get()
    }

    #[test]
    fn inflight_limit_is_per_model_and_released_on_drop() {
        let (a, registry) =
            admission(AdmissionLimits { max_inflight_requests: Some(2), ..AdmissionLimits::default() });
        let t1 = a.admit("m").unwrap();
        let t2 = a.admit("m").unwrap();
        let refused = a.admit("m").err().expect("a third request is refused");
        assert_eq!(refused.reason, RefusalReason::InflightRequests);
        let other = a.admit("other").expect("another model has its own limit");
        assert_eq!(a.inflight("m"), 2);
        drop(t1);
        let t3 = a.admit("m").expect("a released share is free again");
        drop((t2, t3, other));
        assert_eq!(a.inflight("m"), 0);
        assert_eq!(a.inflight("other"), 0);
        assert_eq!(rejected(&a, "m", RefusalReason::InflightRequests), 1);
        assert_eq!(a.metrics.inflight.with_label_values(&["m"]).get(), 0);
        assert!(registry.gather().iter().any(|f| f.name() == "dynamo_frontend_admission_rejected_total"));
    }

    #[test]
    fn queued_tokens_are_released_at_the_first_token_or_the_end() {
        let (a, _registry) = admission(AdmissionLimits { max_queued_tokens: Some(100), ..AdmissionLimits::default() });
        let t1 = a.admit("m").unwrap();
        t1.charge(60).unwrap();
        let t2 = a.admit("m").unwrap();
        assert_eq!(t2.charge(50).unwrap_err().reason, RefusalReason::QueuedTokens);
        t2.charge(40).unwrap();
        assert_eq!(a.queued_tokens("m"), 100);
        assert_eq!(queued_gauge(&a, "m"), 100);
        t1.first_token();
        assert_eq!(a.queued_tokens("m"), 40);
        t1.first_token();
        assert_eq!(a.queued_tokens("m"), 40, "a second first token releases nothing more");
        // A request that fails or is cancelled before its first token drops its ticket.
        drop(t2);
        assert_eq!(a.queued_tokens("m"), 0);
        drop(t1);
        assert_eq!(queued_gauge(&a, "m"), 0);
    }

    #[test]
    fn a_prompt_over_the_limit_alone_is_admitted() {
        let (a, _r) = admission(AdmissionLimits { max_queued_tokens: Some(10), ..AdmissionLimits::default() });
        let long = a.admit("m").unwrap();
        long.charge(500).expect("nothing else queued");
        let short = a.admit("m").unwrap();
        assert_eq!(short.charge(1).unwrap_err().reason, RefusalReason::QueuedTokens);
    }

    #[tokio::test]
    async fn the_task_local_ticket_is_charged_only_inside_its_scope() {
        let (a, _r) = admission(AdmissionLimits { max_queued_tokens: Some(10), ..AdmissionLimits::default() });
        charge_prompt_tokens(1_000).expect("outside a request nothing is counted");
        let t = a.admit("m").unwrap();
        with_ticket(t.clone(), async { charge_prompt_tokens(8) }).await.unwrap();
        assert_eq!(a.queued_tokens("m"), 8);
        let t2 = a.admit("m").unwrap();
        let refused = with_ticket(t2.clone(), async { charge_prompt_tokens(8) }).await;
        assert!(matches!(refused, Err(EngineError::Overloaded(_))));
        drop((t, t2));
        assert_eq!(a.queued_tokens("m"), 0);
        assert_eq!(a.inflight("m"), 0);
    }
}

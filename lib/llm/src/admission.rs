//! Admission control: the one place where the frontend decides to refuse generation
//! requests for load: each model's limits on requests in flight and on queued prompt
//! tokens, and its TTFT target (429), and the count of the global cap's refusals (503).
//! Every refusal is answered at once with `Retry-After`; nothing waits for room. The
//! HTTP side (the global cap's middleware, the refusal's response, a body that holds a
//! share until it is done) is `http/admission.rs`; this module has no HTTP in it, so
//! the pipeline, the remote engine and the routing lab use it without reaching up into
//! `http`.
//!
//! The decisions are pure functions of a model's counts ([`inflight_refusal`],
//! [`queued_tokens_refusal`], [`ttft_refusal`]): the tickets below apply them to the
//! frontend's requests, and the routing lab to its simulated ones. The TTFT target is
//! checked at the request's first pick ([`check_ttft_target`]), against the estimate of
//! the selector that picks ([`crate::routing::Selector::ttft_estimate`]).
//!
//! A request's share is a [`Ticket`]: taken before the engine is called, charged with
//! the prompt's tokens once the pipeline has tokenized it ([`charge_prompt_tokens`],
//! through a task-local scope around the engine call), relieved of them at the first
//! item, and released entirely when the engine's stream is dropped ([`ticketed`]: the
//! generation ended, failed or was cancelled, also for a detached stream whose client
//! left) or the request fails before it has one: nothing is left counted.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use parking_lot::Mutex;
use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::engine::EngineError;

/// The prefix of the admission metrics (the frontend's).
const METRICS_PREFIX: &str = "dynamo_frontend";

/// Limits applied to each model separately (docs/reliability.md, "Admission"): a
/// request beyond one is answered 429 with `Retry-After` at once, never queued.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Most generation requests of one model in flight (a stream until its end).
    pub max_inflight_requests: Option<usize>,
    /// Most prompt tokens of one model's admitted requests that have no first token
    /// yet (counted after tokenization, so only models the frontend tokenizes for).
    /// A prompt longer than the limit is admitted only when nothing else is queued.
    pub max_queued_tokens: Option<u64>,
    /// Refuse a request at admission when the router's estimate of its time to first
    /// token on the best worker already exceeds this ([`crate::routing::Selector::ttft_estimate`]).
    pub ttft_target: Option<Duration>,
}

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
    /// The router's TTFT estimate exceeds the model's TTFT target (429).
    TtftTarget,
}

impl RefusalReason {
    /// The metric label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RefusalReason::GlobalInflight => "global_inflight",
            RefusalReason::InflightRequests => "inflight_requests",
            RefusalReason::QueuedTokens => "queued_tokens",
            RefusalReason::TtftTarget => "ttft_target",
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

/// The refusal of a request to `model`, which has `inflight` requests in flight already.
pub(crate) fn inflight_refusal(limits: &AdmissionLimits, model: &str, inflight: usize) -> Option<Refusal> {
    let max = limits.max_inflight_requests?;
    (inflight >= max).then(|| Refusal {
        reason: RefusalReason::InflightRequests,
        message: format!("model '{model}' has {max} requests in flight, its limit; retry later"),
    })
}

/// The refusal of `tokens` more prompt tokens for `model`, which has `queued` queued
/// already. A prompt alone over the limit is admitted when nothing else is queued, so
/// that a long prompt is slow, not refused forever.
pub(crate) fn queued_tokens_refusal(limits: &AdmissionLimits, model: &str, queued: u64, tokens: u64) -> Option<Refusal> {
    let max = limits.max_queued_tokens?;
    (queued > 0 && queued.saturating_add(tokens) > max).then(|| Refusal {
        reason: RefusalReason::QueuedTokens,
        message: format!(
            "model '{model}' has {queued} prompt tokens queued; {tokens} more would pass its limit of {max}; retry later"
        ),
    })
}

/// The refusal of a request to `model` whose time to first token the router estimates
/// at `estimate` (`None`: it cannot say, and the request is admitted).
pub(crate) fn ttft_refusal(limits: &AdmissionLimits, model: &str, estimate: Option<Duration>) -> Option<Refusal> {
    let (target, estimate) = (limits.ttft_target?, estimate?);
    (estimate > target).then(|| Refusal {
        reason: RefusalReason::TtftTarget,
        message: format!(
            "model '{model}': the estimated time to first token on the best worker is {} ms, over the target of {} ms; retry later",
            estimate.as_millis(),
            target.as_millis()
        ),
    })
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
            if let Some(refusal) = inflight_refusal(&self.limits, model, c.inflight) {
                drop(c);
                return Err(self.refused(model, refusal));
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
            first_seen: AtomicBool::new(false),
        }))
    }

    /// The request of `ticket` reached its engine.
    pub(crate) fn admitted(&self, ticket: &Ticket) {
        self.metrics.admitted.with_label_values(&[&ticket.model]).inc();
    }

    fn refused(&self, model: &str, refusal: Refusal) -> Refusal {
        self.metrics.rejected.with_label_values(&[model, refusal.reason.as_str()]).inc();
        refusal
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
    /// Whether its first item came (every later item returns at once, without a lock).
    first_seen: AtomicBool,
}

impl Ticket {
    /// Count `tokens` more prompt tokens as queued, or refuse (counted) when that would
    /// take the model past its limit ([`queued_tokens_refusal`]).
    pub(crate) fn charge(&self, tokens: u64) -> Result<(), Refusal> {
        {
            let mut c = self.counts.lock();
            if let Some(refusal) = queued_tokens_refusal(&self.limits, &self.model, c.queued_tokens, tokens) {
                drop(c);
                return Err(self.refused(refusal));
            }
            c.queued_tokens = c.queued_tokens.saturating_add(tokens);
        }
        *self.charged.lock() += tokens;
        self.metrics.queued_tokens.with_label_values(&[&self.model]).add(clamp(tokens));
        Ok(())
    }

    /// The request produced an item: at the first, its prompt tokens are no longer queued.
    pub(crate) fn first_token(&self) {
        if !self.first_seen.swap(true, Ordering::AcqRel) {
            self.release_queued();
        }
    }

    /// Its prompt tokens are no longer queued (its first item came, or it ended).
    fn release_queued(&self) {
        let tokens = std::mem::take(&mut *self.charged.lock());
        if tokens > 0 {
            let mut c = self.counts.lock();
            c.queued_tokens = c.queued_tokens.saturating_sub(tokens);
            drop(c);
            self.metrics.queued_tokens.with_label_values(&[&self.model]).sub(clamp(tokens));
        }
    }

    /// Refuse (counted) when the model has a TTFT target and `estimate` (asked only
    /// then) says the request would miss it ([`ttft_refusal`]).
    pub(crate) fn check_ttft(&self, estimate: impl FnOnce() -> Option<Duration>) -> Result<(), Refusal> {
        if self.limits.ttft_target.is_none() {
            return Ok(());
        }
        match ttft_refusal(&self.limits, &self.model, estimate()) {
            Some(refusal) => Err(self.refused(refusal)),
            None => Ok(()),
        }
    }

    fn refused(&self, refusal: Refusal) -> Refusal {
        self.metrics.rejected.with_label_values(&[&self.model, refusal.reason.as_str()]).inc();
        refusal
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release_queued();
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

/// The engine stream of an admitted request, holding its `ticket` until the stream is
/// dropped, that is until its generation ends, whoever reads it (an SSE body, a
/// detached resumable stream that outlives its client, a background response), and
/// relieving the ticket's queued tokens at its first item.
pub(crate) fn ticketed<T: Send + 'static>(stream: BoxStream<'static, T>, ticket: Arc<Ticket>) -> BoxStream<'static, T> {
    stream.inspect(move |_| ticket.first_token()).boxed()
}

/// Check the current request's TTFT target against `estimate` (the selector's, asked
/// only when the model has a target); no effect outside an admitted HTTP request.
pub(crate) fn check_ttft_target(estimate: impl FnOnce() -> Option<Duration>) -> Result<(), EngineError> {
    CURRENT.try_with(|t| t.check_ttft(estimate)).unwrap_or(Ok(())).map_err(EngineError::from)
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

    #[test]
    fn the_decisions_are_pure_functions_of_the_counts() {
        let none = AdmissionLimits::default();
        assert_eq!(inflight_refusal(&none, "m", usize::MAX), None);
        assert_eq!(queued_tokens_refusal(&none, "m", u64::MAX, 1), None);
        assert_eq!(ttft_refusal(&none, "m", Some(Duration::MAX)), None);
        let limits = AdmissionLimits {
            max_inflight_requests: Some(2),
            max_queued_tokens: Some(100),
            ttft_target: Some(Duration::from_millis(500)),
        };
        assert_eq!(inflight_refusal(&limits, "m", 1), None);
        assert_eq!(inflight_refusal(&limits, "m", 2).unwrap().reason, RefusalReason::InflightRequests);
        assert_eq!(queued_tokens_refusal(&limits, "m", 0, 1_000), None, "alone over the limit");
        assert_eq!(queued_tokens_refusal(&limits, "m", 60, 40), None);
        assert_eq!(queued_tokens_refusal(&limits, "m", 60, 41).unwrap().reason, RefusalReason::QueuedTokens);
        assert_eq!(ttft_refusal(&limits, "m", None), None, "no estimate: admitted");
        assert_eq!(ttft_refusal(&limits, "m", Some(Duration::from_millis(500))), None, "at the target");
        let late = ttft_refusal(&limits, "m", Some(Duration::from_millis(501))).unwrap();
        assert_eq!(late.reason, RefusalReason::TtftTarget);
        assert!(late.message.contains("501 ms") && late.message.contains("500 ms"), "{}", late.message);
    }

    #[tokio::test]
    async fn the_ttft_target_refuses_on_the_estimate_and_is_counted() {
        let target = Duration::from_millis(200);
        let (a, _r) = admission(AdmissionLimits { ttft_target: Some(target), ..AdmissionLimits::default() });
        check_ttft_target(|| Some(Duration::MAX)).expect("outside a request nothing is checked");
        let t = a.admit("m").unwrap();
        with_ticket(t.clone(), async { check_ttft_target(|| Some(Duration::from_millis(150))) }).await.unwrap();
        with_ticket(t.clone(), async { check_ttft_target(|| None) }).await.expect("no estimate yet");
        let refused = with_ticket(t.clone(), async { check_ttft_target(|| Some(Duration::from_millis(250))) }).await;
        assert!(matches!(refused, Err(EngineError::Overloaded(ref m)) if m.contains("250 ms")), "{refused:?}");
        assert_eq!(rejected(&a, "m", RefusalReason::TtftTarget), 1);
        // Without a target the estimate is not even asked for.
        let (free, _r) = admission(AdmissionLimits::default());
        let t = free.admit("m").unwrap();
        with_ticket(t, async { check_ttft_target(|| unreachable!("no target, no estimate")) }).await.unwrap();
    }

    #[tokio::test]
    async fn a_ticketed_stream_holds_its_share_until_it_is_dropped() {
        let (a, _r) = admission(AdmissionLimits { max_inflight_requests: Some(1), ..AdmissionLimits::default() });
        let t = a.admit("m").unwrap();
        t.charge(30).unwrap();
        let mut stream = ticketed(futures::stream::iter([1, 2, 3]).boxed(), t);
        assert_eq!(a.queued_tokens("m"), 30);
        assert_eq!(stream.next().await, Some(1));
        assert_eq!(a.queued_tokens("m"), 0, "the first item relieves the queued tokens");
        while stream.next().await.is_some() {}
        assert_eq!(a.inflight("m"), 1, "held until dropped, not just exhausted");
        assert!(a.admit("m").is_err());
        drop(stream);
        assert_eq!(a.inflight("m"), 0);
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

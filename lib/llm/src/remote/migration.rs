//! Every resend of a token-level request is decided here. The remote engine sends each
//! attempt direct to an instance it picks ([`Resender::send`]); this module decides,
//! when an attempt fails, whether and where the request goes next:
//!
//! - **Not started** — the instance was unreachable, refused the request (draining),
//!   did not take it within the response timeout, or its stream broke before the first
//!   item: the request is sent to another instance. No output reached the caller, so
//!   this is always safe; it is bounded by [`MigrationPolicy::resend_limit`] and does not
//!   count against the migration limit. When no other instance takes it, the caller
//!   gets the first failure. A first-item timeout (`DYN_STREAM_FIRST_ITEM_TIMEOUT`) is
//!   not resent: the worker took the request and may still be working on it.
//! - **Lost mid-stream** — the worker died, stopped answering or timed out after some
//!   items: the request is continued on another worker with the prompt plus the tokens
//!   generated so far, so the client sees one uninterrupted stream (only slower).
//!   Bounded by [`MigrationPolicy::limit`] (per model, `--migration-limit`).
//!
//! Only failures of the worker or the path to it are resent (`Disconnected`,
//! `Unavailable`, `Timeout` from the runtime, a gone instance). An error the engine
//! itself returned, a malformed item, or a request the caller stopped never is. An
//! instance that did not take a request in time is avoided by new requests until it
//! answers again; one that refused or broke a stream is skipped for a moment; a slow
//! handler (a stream bound) sets nothing aside ([`Resender::set_aside`]).

use futures::stream::BoxStream;
use futures::StreamExt;
use prometheus::IntCounter;

use dynamo_runtime::ErrorKind;

use crate::engine::{EngineError, RequestContext, TokenStream};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};

use super::wire::decode_error;

/// Resends of a request no worker started, by default.
pub const DEFAULT_RESEND_LIMIT: u32 = 3;

/// Why one item of a worker's token stream is not an output.
#[derive(Debug)]
pub(crate) enum StreamFailure {
    /// The runtime ended the stream (the worker's error frame, a lost connection, a timeout).
    Runtime(dynamo_runtime::Error),
    /// The item arrived but is not an [`LLMEngineOutput`].
    Decode(EngineError),
}

impl StreamFailure {
    /// Whether another worker may take the request over from here.
    fn resendable(&self) -> bool {
        matches!(self, StreamFailure::Runtime(e) if resendable(e.kind()))
    }

    /// A stream bound ran out (first-item or item timeout): the worker took the request
    /// and may still be working on it, so before any output it is not resent (the
    /// caller gets the timeout, as a 504); after some output it is a lost stream.
    fn is_stream_bound(&self) -> bool {
        matches!(self, StreamFailure::Runtime(e) if e.kind() == ErrorKind::Timeout)
    }

    pub(crate) fn into_engine_error(self) -> EngineError {
        match self {
            StreamFailure::Runtime(e) => decode_error(e),
            StreamFailure::Decode(e) => e,
        }
    }
}

/// Failures of the worker or the path to it.
fn resendable(kind: ErrorKind) -> bool {
    matches!(kind, ErrorKind::Disconnected | ErrorKind::Unavailable | ErrorKind::Timeout | ErrorKind::NotTaken)
}

/// A worker's token stream before migration: outputs, or why it broke.
pub(crate) type WorkerStream = BoxStream<'static, Result<LLMEngineOutput, StreamFailure>>;

/// One sent attempt: the stream and the instance it went to.
pub(crate) struct Attempt {
    pub stream: WorkerStream,
    pub instance: u64,
}

/// Why an attempt could not be sent.
#[derive(Debug)]
pub(crate) enum SendError {
    /// `instance` was picked but could not be reached or is gone: another may take it.
    Unreachable { instance: u64, error: dynamo_runtime::Error },
    /// Final (no instance at all, a pinned instance gone, a bad request).
    Failed(EngineError),
}

/// Sends one attempt of a request to an instance it picks, avoiding those in `avoid`.
#[async_trait::async_trait]
pub(crate) trait Resender: Send + Sync + 'static {
    async fn send(&self, request: PreprocessedRequest, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt, SendError>;

    /// `instance` failed a request with `error`: keep new requests away from it (until it
    /// answers again when it did not take the request in time).
    fn set_aside(&self, instance: u64, error: &dynamo_runtime::Error);
}

/// The bounds on resending one request, and where migrations are counted.
#[derive(Clone)]
pub struct MigrationPolicy {
    /// Continuations of a stream lost mid-way allowed per request (0: none); per model,
    /// `--migration-limit` or the model entry's `migration_limit`.
    pub limit: u32,
    /// Resends of a request no worker started (unreachable, refused, not taken within
    /// `DYN_RESPONSE_TIMEOUT`, lost before its first item); default
    /// [`DEFAULT_RESEND_LIMIT`].
    pub resend_limit: u32,
    /// Incremented once per continuation of a lost stream.
    pub counter: Option<IntCounter>,
}

impl Default for MigrationPolicy {
    fn default() -> Self {
        MigrationPolicy { limit: 0, resend_limit: DEFAULT_RESEND_LIMIT, counter: None }
    }
}

impl std::fmt::Debug for MigrationPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationPolicy").field("limit", &self.limit).field("resend_limit", &self.resend_limit).finish()
    }
}

/// The request that continues `original` after `generated` tokens.
pub(crate) fn continuation(original: &PreprocessedRequest, generated: &[u32]) -> PreprocessedRequest {
    let mut next = original.clone();
    next.token_ids.extend_from_slice(generated);
    let done = u32::try_from(generated.len()).unwrap_or(u32::MAX);
    let stop = &mut next.stop_conditions;
    stop.max_tokens = stop.max_tokens.map(|m| m.saturating_sub(done).max(1));
    stop.min_tokens = stop.min_tokens.map(|m| m.saturating_sub(done));
    // The prefix estimate belonged to the first worker.
    next.estimated_prefix_hit_num_blocks = None;
    next
}

struct State<R> {
    resender: R,
    request: PreprocessedRequest,
    ctx: RequestContext,
    current: WorkerStream,
    /// The instance of the current attempt.
    instance: u64,
    /// Whether the current attempt delivered an output.
    started: bool,
    avoid: Vec<u64>,
    generated: Vec<u32>,
    migrations_left: u32,
    resends_left: u32,
    counter: Option<IntCounter>,
    done: bool,
}

impl<R: Resender> State<R> {
    /// Send `request` (its continuation after the tokens generated so far), resending
    /// while instances are unreachable and resends are left.
    async fn send(&mut self, request: PreprocessedRequest) -> Result<Attempt, EngineError> {
        loop {
            match self.resender.send(request.clone(), &self.ctx, &self.avoid).await {
                Ok(attempt) => return Ok(attempt),
                Err(SendError::Failed(e)) => return Err(e),
                Err(SendError::Unreachable { instance, error }) => {
                    self.resender.set_aside(instance, &error);
                    self.avoid.push(instance);
                    if self.resends_left == 0 || self.ctx.is_stopped() {
                        return Err(decode_error(error));
                    }
                    self.resends_left -= 1;
                    tracing::warn!(
                        request = self.ctx.id(),
                        instance = %format_args!("{instance:x}"),
                        error = %error.full_message(),
                        "instance unreachable; sending the request to another instance"
                    );
                }
            }
        }
    }

    fn switch_to(&mut self, attempt: Attempt) {
        self.avoid.push(attempt.instance);
        self.instance = attempt.instance;
        self.current = attempt.stream;
        self.started = false;
    }
}

/// Send `request` through `resender` (resending while instances are unreachable) and
/// return its engine stream, continued on other workers when it breaks (see the module
/// doc). The stream ends when the worker's does; a missing finish reason is left for
/// the detokenizer to report.
pub(crate) async fn send_resending<R: Resender>(
    resender: R,
    request: PreprocessedRequest,
    ctx: RequestContext,
    policy: MigrationPolicy,
) -> Result<TokenStream, EngineError> {
    let mut state = State {
        resender,
        request,
        ctx,
        current: futures::stream::empty().boxed(),
        instance: 0,
        started: false,
        avoid: Vec::new(),
        generated: Vec::new(),
        migrations_left: policy.limit,
        resends_left: policy.resend_limit,
        counter: policy.counter,
        done: false,
    };
    let first = state.send(state.request.clone()).await?;
    state.switch_to(first);
    Ok(futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            let failure = match st.current.next().await {
                Some(Ok(out)) => {
                    st.started = true;
                    st.generated.extend_from_slice(&out.token_ids);
                    st.done = out.finish_reason.is_some();
                    return Some((Ok(out), st));
                }
                None => return None,
                Some(Err(failure)) => failure,
            };
            if !failure.resendable() || st.ctx.is_stopped() || (!st.started && failure.is_stream_bound()) {
                st.done = true;
                return Some((Err(failure.into_engine_error()), st));
            }
            if let StreamFailure::Runtime(error) = &failure {
                st.resender.set_aside(st.instance, error);
            }
            let lost = if st.started { &mut st.migrations_left } else { &mut st.resends_left };
            if *lost == 0 {
                st.done = true;
                return Some((Err(failure.into_engine_error()), st));
            }
            *lost -= 1;
            let reason = failure.into_engine_error();
            if st.started {
                if let Some(c) = &st.counter {
                    c.inc();
                }
                tracing::warn!(
                    request = st.ctx.id(),
                    instance = %format_args!("{:x}", st.instance),
                    generated = st.generated.len(),
                    left = st.migrations_left,
                    error = %reason,
                    "worker stream broke; continuing the request on another worker"
                );
            } else {
                tracing::warn!(
                    request = st.ctx.id(),
                    instance = %format_args!("{:x}", st.instance),
                    left = st.resends_left,
                    error = %reason,
                    "worker did not start the request; sending it to another instance"
                );
            }
            let next = continuation(&st.request, &st.generated);
            match st.send(next).await {
                Ok(attempt) => st.switch_to(attempt),
                Err(e) if !st.started => {
                    // No other instance took it: the first failure says what happened
                    // (a first-item timeout stays a timeout).
                    st.done = true;
                    tracing::warn!(request = st.ctx.id(), error = %e, "resending the request failed");
                    return Some((Err(reason), st));
                }
                Err(e) => {
                    st.done = true;
                    let e = EngineError::Unavailable(format!("{reason}; migrating the request failed: {e}"));
                    return Some((Err(e), st));
                }
            }
        }
    })
    .boxed())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::protocols::common::{FinishReason, StopConditions};

    type Items = Vec<Result<LLMEngineOutput, StreamFailure>>;
    /// What one send is answered with: a stream's items, or unreachable with this kind.
    type Outcome = Result<Items, ErrorKind>;
    /// Each send's request and the instances it was to avoid.
    type Sent = Vec<(PreprocessedRequest, Vec<u64>)>;

    fn out(ids: &[u32], finish: Option<FinishReason>) -> Result<LLMEngineOutput, StreamFailure> {
        Ok(LLMEngineOutput { token_ids: ids.to_vec(), finish_reason: finish, ..Default::default() })
    }

    fn broken(kind: ErrorKind) -> Result<LLMEngineOutput, StreamFailure> {
        Err(StreamFailure::Runtime(dynamo_runtime::Error::new(kind, "worker gone")))
    }

    /// The runtime's error for a request no worker took within the response timeout.
    fn not_taken() -> Result<LLMEngineOutput, StreamFailure> {
        let message = "no worker took the request within 2s (DYN_RESPONSE_TIMEOUT)";
        Err(StreamFailure::Runtime(dynamo_runtime::Error::new(ErrorKind::NotTaken, message)))
    }

    /// Answers each send with the next scripted outcome (instance 100 + n for the n-th
    /// send, from 0) and records what it was sent and what was set aside.
    #[derive(Clone, Default)]
    struct Script {
        outcomes: Arc<Mutex<Vec<Outcome>>>,
        sent: Arc<Mutex<Sent>>,
        set_aside: Arc<Mutex<Vec<(u64, ErrorKind)>>>,
    }

    impl Script {
        fn then(&self, outcome: Outcome) -> &Self {
            self.outcomes.lock().push(outcome);
            self
        }
    }

    #[async_trait::async_trait]
    impl Resender for Script {
        async fn send(&self, request: PreprocessedRequest, _: &RequestContext, avoid: &[u64]) -> Result<Attempt, SendError> {
            let instance = 100 + self.sent.lock().len() as u64;
            self.sent.lock().push((request, avoid.to_vec()));
            let mut outcomes = self.outcomes.lock();
            if outcomes.is_empty() {
                return Err(SendError::Failed(EngineError::Unavailable("no instances".into())));
            }
            match outcomes.remove(0) {
                Ok(items) => Ok(Attempt { stream: futures::stream::iter(items).boxed(), instance }),
                Err(kind) => Err(SendError::Unreachable { instance, error: dynamo_runtime::Error::new(kind, "unreachable") }),
            }
        }

        fn set_aside(&self, instance: u64, error: &dynamo_runtime::Error) {
            self.set_aside.lock().push((instance, error.kind()));
        }
    }

    fn request() -> PreprocessedRequest {
        PreprocessedRequest {
            token_ids: vec![1, 2, 3],
            stop_conditions: StopConditions { max_tokens: Some(10), min_tokens: Some(2), ..Default::default() },
            estimated_prefix_hit_num_blocks: Some(4),
            ..Default::default()
        }
    }

    /// The outputs (or the error of the first send), and how many migrations were counted.
    type Outputs = Result<Vec<Result<LLMEngineOutput, EngineError>>, EngineError>;

    async fn run(script: &Script, limit: u32, resend_limit: u32) -> (Outputs, u64) {
        let counter = IntCounter::new("m", "m").unwrap();
        let policy = MigrationPolicy { limit, resend_limit, counter: Some(counter.clone()) };
        let out = match send_resending(script.clone(), request(), RequestContext::new("r"), policy).await {
            Ok(stream) => Ok(stream.collect().await),
            Err(e) => Err(e),
        };
        (out, counter.get())
    }

    fn ids(items: &[Result<LLMEngineOutput, EngineError>]) -> Vec<u32> {
        items.iter().flat_map(|r| r.as_ref().unwrap().token_ids.clone()).collect()
    }

    #[tokio::test]
    async fn a_broken_stream_continues_with_prompt_plus_generated_tokens() {
        let script = Script::default();
        script
            .then(Ok(vec![out(&[10], None), out(&[11], None), broken(ErrorKind::Disconnected)]))
            .then(Ok(vec![out(&[12], None), out(&[13], Some(FinishReason::Length))]));
        let (items, migrations) = run(&script, 3, 0).await;
        let items = items.unwrap();
        assert_eq!(ids(&items), vec![10, 11, 12, 13]);
        assert_eq!(items.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
        assert_eq!(migrations, 1);
        let sent = script.sent.lock();
        let (next, avoid) = &sent[1];
        assert_eq!(next.token_ids, vec![1, 2, 3, 10, 11]);
        assert_eq!(next.stop_conditions.max_tokens, Some(8));
        assert_eq!(next.stop_conditions.min_tokens, Some(0));
        assert_eq!(next.estimated_prefix_hit_num_blocks, None);
        assert_eq!(avoid, &vec![100], "the failed instance is avoided");
        assert_eq!(*script.set_aside.lock(), vec![(100, ErrorKind::Disconnected)]);
    }

    #[tokio::test]
    async fn the_limit_bounds_continuations() {
        let script = Script::default();
        script
            .then(Ok(vec![out(&[1], None), broken(ErrorKind::Disconnected)]))
            .then(Ok(vec![out(&[2], None), broken(ErrorKind::Timeout)]))
            .then(Ok(vec![out(&[5], Some(FinishReason::Stop))]));
        let (items, migrations) = run(&script, 1, 3).await;
        let items = items.unwrap();
        assert!(matches!(items.last().unwrap(), Err(EngineError::Timeout(_))), "{items:?}");
        assert_eq!(script.sent.lock().len(), 2);
        assert_eq!(migrations, 1);
    }

    #[tokio::test]
    async fn a_request_no_worker_started_is_resent_without_counting_as_a_migration() {
        let script = Script::default();
        script
            .then(Err(ErrorKind::Unavailable))
            .then(Ok(vec![not_taken()]))
            .then(Ok(vec![out(&[7], Some(FinishReason::Stop))]));
        let (items, migrations) = run(&script, 0, 2).await;
        assert_eq!(ids(&items.unwrap()), vec![7], "resent although the migration limit is 0");
        assert_eq!(migrations, 0);
        assert_eq!(*script.set_aside.lock(), vec![(100, ErrorKind::Unavailable), (101, ErrorKind::NotTaken)]);
        let sent = script.sent.lock();
        assert_eq!(sent[2].1, vec![100, 101], "both failed instances are avoided");
        assert_eq!(sent[2].0.token_ids, vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn a_first_item_timeout_is_not_resent_and_sets_nothing_aside_as_unresponsive() {
        let script = Script::default();
        script.then(Ok(vec![broken(ErrorKind::Timeout)])).then(Ok(vec![out(&[7], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 3).await;
        let items = items.unwrap();
        assert!(matches!(items.as_slice(), [Err(EngineError::Timeout(_))]), "{items:?}");
        assert_eq!(script.sent.lock().len(), 1, "the worker took it: not sent again");
    }

    #[tokio::test]
    async fn the_resend_limit_bounds_resends() {
        let script = Script::default();
        script.then(Err(ErrorKind::Unavailable)).then(Err(ErrorKind::Disconnected)).then(Ok(vec![out(&[1], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 1).await;
        assert!(matches!(items, Err(EngineError::Unavailable(_))), "{items:?}");
        assert_eq!(script.sent.lock().len(), 2);
    }

    #[tokio::test]
    async fn engine_errors_and_a_zero_limit_do_not_migrate() {
        let script = Script::default();
        let handler = Err(StreamFailure::Runtime(dynamo_runtime::Error::new(ErrorKind::Handler, "ValueError: x")));
        script.then(Ok(vec![out(&[1], None), handler])).then(Ok(vec![out(&[5], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 3).await;
        assert!(matches!(items.unwrap().last().unwrap(), Err(EngineError::Internal(m)) if m.contains("ValueError")));
        assert_eq!(script.sent.lock().len(), 1);
        let script = Script::default();
        script.then(Ok(vec![out(&[1], None), broken(ErrorKind::Disconnected)])).then(Ok(vec![out(&[5], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 0, 3).await;
        assert!(matches!(items.unwrap().last().unwrap(), Err(EngineError::Unavailable(_))));
        assert_eq!(script.sent.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_resend_is_an_unavailable_error_naming_both_causes() {
        let script = Script::default();
        script.then(Ok(vec![out(&[1], None), broken(ErrorKind::Disconnected)]));
        let (items, _) = run(&script, 2, 0).await;
        match items.unwrap().last().unwrap() {
            Err(EngineError::Unavailable(m)) => assert!(m.contains("worker gone") && m.contains("no instances"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

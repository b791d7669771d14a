//! Every resend of a request to a discovered model is decided here, token-level
//! (`backend` models) and OpenAI-level (`chat`/`completions`) alike. The remote engine
//! sends each attempt direct to an instance it picks ([`Resender::send`]); this module
//! decides, when an attempt fails, whether and where the request goes next:
//!
//! - **Not started** — the instance was unreachable, refused the request (draining),
//!   did not take it within the response timeout, or its stream broke before the first
//!   item: the request is sent to another instance. No output reached the caller, so
//!   this is always safe; it is bounded by [`MigrationPolicy::resend_limit`] and does not
//!   count against the migration limit. When no other instance takes it, the caller
//!   gets the first failure. A first-item timeout (`DYN_STREAM_FIRST_ITEM_TIMEOUT`) is
//!   not resent: the worker took the request and may still be working on it.
//! - **Lost mid-stream** — the worker died, stopped answering or timed out after some
//!   items: a token request is continued on another worker with the prompt plus the
//!   tokens generated so far, so the client sees one uninterrupted stream (only slower).
//!   Bounded by [`MigrationPolicy::limit`] (per model, `--migration-limit`). An
//!   OpenAI-level request cannot be continued (its chunks carry text, not the tokens a
//!   worker could resume from: [`Resumable::continuation`] is `None`), so its lost
//!   stream ends with the error.
//!
//! Only failures of the worker or the path to it are resent (`Disconnected`,
//! `Unavailable`, `Timeout` from the runtime, a gone instance). An error the engine
//! itself returned, a malformed item, or a request the caller stopped never is. An
//! instance that did not take a request in time is avoided by new requests until it
//! answers again; one that refused or broke a stream is skipped for a moment; a slow
//! handler (a stream bound) sets nothing aside ([`Resender::set_aside`]).

use std::marker::PhantomData;

use futures::stream::BoxStream;
use futures::StreamExt;
use prometheus::IntCounter;

use dynamo_runtime::ErrorKind;

use crate::engine::{EngineError, RequestContext, StreamItem};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::FinishingChunk;

use super::wire::decode_error;

/// Resends of a request no worker started, by default.
pub const DEFAULT_RESEND_LIMIT: u32 = 3;
/// Default continuations of a stream lost mid-way at a frontend, for models whose
/// worker registers no limit of its own (`--migration-limit`; 0 turns migration off).
pub const DEFAULT_MIGRATION_LIMIT: u32 = 3;

/// The environment variable that sets [`MigrationPolicy::resend_limit`] (a frontend's
/// `--resend-limit` wins).
pub const RESEND_LIMIT_ENV: &str = "DYN_RESEND_LIMIT";

/// `DYN_RESEND_LIMIT` is set to something that is not a number of resends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{RESEND_LIMIT_ENV}={value:?} is not a number of resends (a whole number, 0 or more)")]
pub struct BadResendLimit {
    /// The value as set.
    pub value: String,
}

/// The resend limit `DYN_RESEND_LIMIT` sets, `None` when it is not set.
pub fn resend_limit_from_env() -> Result<Option<u32>, BadResendLimit> {
    match std::env::var(RESEND_LIMIT_ENV) {
        Ok(value) => parse_resend_limit(&value).map(Some),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(BadResendLimit { value: v.to_string_lossy().into_owned() }),
    }
}

fn parse_resend_limit(value: &str) -> Result<u32, BadResendLimit> {
    value.trim().parse::<u32>().map_err(|_| BadResendLimit { value: value.to_string() })
}

/// Why one item of a worker's stream is not an output.
#[derive(Debug)]
pub(crate) enum StreamFailure {
    /// The runtime ended the stream (the worker's error frame, a lost connection, a timeout).
    Runtime(dynamo_runtime::Error),
    /// The item arrived but is not an output of the expected type.
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

/// A request [`send_resending`] can resend: what its stream's outputs are, and how a
/// stream lost after some of them continues elsewhere.
pub(crate) trait Resumable: Clone + Send + Sync + 'static {
    /// One output of the worker's stream.
    type Output: Send + 'static;

    /// Whether `output` ends the stream (carries a finish reason).
    fn finishes(output: &Self::Output) -> bool;

    /// The tokens `output` carries (kept for [`Self::continuation`]).
    fn tokens(output: &Self::Output) -> &[u32];

    /// The request that continues `self` on another worker after `generated` tokens
    /// were delivered; `None` when a started stream cannot be continued.
    fn continuation(&self, generated: &[u32]) -> Option<Self>;
}

impl Resumable for PreprocessedRequest {
    type Output = LLMEngineOutput;

    fn finishes(output: &LLMEngineOutput) -> bool {
        output.finish_reason.is_some()
    }

    fn tokens(output: &LLMEngineOutput) -> &[u32] {
        &output.token_ids
    }

    fn continuation(&self, generated: &[u32]) -> Option<Self> {
        Some(continuation(self, generated))
    }
}

/// An OpenAI-level request (`Q`, whose stream is chunks `T`): resent whole before its
/// first chunk, never continued after it (its chunks carry text, not tokens).
pub(crate) struct OpenAIRequest<Q, T> {
    /// The request as the worker takes it.
    pub body: Q,
    chunk: PhantomData<fn() -> T>,
}

impl<Q, T> OpenAIRequest<Q, T> {
    pub(crate) fn new(body: Q) -> Self {
        OpenAIRequest { body, chunk: PhantomData }
    }
}

impl<Q: Clone, T> Clone for OpenAIRequest<Q, T> {
    fn clone(&self) -> Self {
        OpenAIRequest::new(self.body.clone())
    }
}

impl<Q, T> Resumable for OpenAIRequest<Q, T>
where
    Q: Clone + Send + Sync + 'static,
    T: FinishingChunk + Send + 'static,
{
    type Output = StreamItem<T>;

    fn finishes(output: &StreamItem<T>) -> bool {
        output.data.finishes()
    }

    fn tokens(_: &StreamItem<T>) -> &[u32] {
        &[]
    }

    fn continuation(&self, _: &[u32]) -> Option<Self> {
        None
    }
}

/// A worker's stream before migration: outputs, or why it broke.
pub(crate) type WorkerStream<O> = BoxStream<'static, Result<O, StreamFailure>>;

/// One sent attempt: the stream and the instance it went to.
pub(crate) struct Attempt<O> {
    pub stream: WorkerStream<O>,
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
pub(crate) trait Resender<Q: Resumable>: Send + Sync + 'static {
    async fn send(&self, request: Q, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt<Q::Output>, SendError>;

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
    /// `DYN_RESPONSE_TIMEOUT`, lost before its first item); `--resend-limit` or
    /// `DYN_RESEND_LIMIT`, default [`DEFAULT_RESEND_LIMIT`].
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

struct State<R, Q: Resumable> {
    resender: R,
    request: Q,
    ctx: RequestContext,
    current: WorkerStream<Q::Output>,
    /// The instance of the current attempt.
    instance: u64,
    /// Whether the current attempt delivered an output.
    started: bool,
    /// Whether any attempt delivered an output.
    delivered: bool,
    avoid: Vec<u64>,
    generated: Vec<u32>,
    migrations_left: u32,
    resends_left: u32,
    counter: Option<IntCounter>,
    done: bool,
}

impl<R: Resender<Q>, Q: Resumable> State<R, Q> {
    /// Send `request` (its continuation after the outputs so far), resending while
    /// instances are unreachable and resends are left.
    async fn send(&mut self, request: Q) -> Result<Attempt<Q::Output>, EngineError> {
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

    fn switch_to(&mut self, attempt: Attempt<Q::Output>) {
        self.avoid.push(attempt.instance);
        self.instance = attempt.instance;
        self.current = attempt.stream;
        self.started = false;
    }

    /// The request for the next attempt: the original until an output was delivered,
    /// then its continuation (`None`: it cannot be continued).
    fn next_request(&self) -> Option<Q> {
        if self.delivered {
            self.request.continuation(&self.generated)
        } else {
            Some(self.request.clone())
        }
    }
}

/// Send `request` through `resender` (resending while instances are unreachable) and
/// return its stream, continued on other workers when it breaks (see the module doc).
/// The stream ends when the worker's does; a missing finish reason is left to the
/// caller to report.
pub(crate) async fn send_resending<R: Resender<Q>, Q: Resumable>(
    resender: R,
    request: Q,
    ctx: RequestContext,
    policy: MigrationPolicy,
) -> Result<BoxStream<'static, Result<Q::Output, EngineError>>, EngineError> {
    let mut state = State {
        resender,
        request,
        ctx,
        current: futures::stream::empty().boxed(),
        instance: 0,
        started: false,
        delivered: false,
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
                    st.delivered = true;
                    st.generated.extend_from_slice(Q::tokens(&out));
                    st.done = Q::finishes(&out);
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
            let next = st.next_request();
            let lost = if st.started { &mut st.migrations_left } else { &mut st.resends_left };
            let Some(next) = next.filter(|_| *lost > 0) else {
                st.done = true;
                return Some((Err(failure.into_engine_error()), st));
            };
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

    type Items<O> = Vec<Result<O, StreamFailure>>;
    /// What one send is answered with: a stream's items, or unreachable with this kind.
    type Outcome<O> = Result<Items<O>, ErrorKind>;
    /// Each send's request and the instances it was to avoid.
    type Sent<Q> = Vec<(Q, Vec<u64>)>;

    fn out(ids: &[u32], finish: Option<FinishReason>) -> Result<LLMEngineOutput, StreamFailure> {
        Ok(LLMEngineOutput { token_ids: ids.to_vec(), finish_reason: finish, ..Default::default() })
    }

    fn broken<O>(kind: ErrorKind) -> Result<O, StreamFailure> {
        Err(StreamFailure::Runtime(dynamo_runtime::Error::new(kind, "worker gone")))
    }

    /// The runtime's error for a request no worker took within the response timeout.
    fn not_taken() -> Result<LLMEngineOutput, StreamFailure> {
        let message = "no worker took the request within 2s (DYN_RESPONSE_TIMEOUT)";
        Err(StreamFailure::Runtime(dynamo_runtime::Error::new(ErrorKind::NotTaken, message)))
    }

    /// Answers each send with the next scripted outcome (instance 100 + n for the n-th
    /// send, from 0) and records what it was sent and what was set aside.
    struct Script<Q: Resumable> {
        outcomes: Arc<Mutex<Vec<Outcome<Q::Output>>>>,
        sent: Arc<Mutex<Sent<Q>>>,
        set_aside: Arc<Mutex<Vec<(u64, ErrorKind)>>>,
    }

    impl<Q: Resumable> Default for Script<Q> {
        fn default() -> Self {
            Script { outcomes: Default::default(), sent: Default::default(), set_aside: Default::default() }
        }
    }

    impl<Q: Resumable> Clone for Script<Q> {
        fn clone(&self) -> Self {
            Script { outcomes: self.outcomes.clone(), sent: self.sent.clone(), set_aside: self.set_aside.clone() }
        }
    }

    impl<Q: Resumable> Script<Q> {
        fn then(&self, outcome: Outcome<Q::Output>) -> &Self {
            self.outcomes.lock().push(outcome);
            self
        }
    }

    #[async_trait::async_trait]
    impl<Q: Resumable> Resender<Q> for Script<Q> {
        async fn send(&self, request: Q, _: &RequestContext, avoid: &[u64]) -> Result<Attempt<Q::Output>, SendError> {
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

    async fn run(script: &Script<PreprocessedRequest>, limit: u32, resend_limit: u32) -> (Outputs, u64) {
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
        let script = Script::<PreprocessedRequest>::default();
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
        let script = Script::<PreprocessedRequest>::default();
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
        let script = Script::<PreprocessedRequest>::default();
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
        let script = Script::<PreprocessedRequest>::default();
        script.then(Ok(vec![broken(ErrorKind::Timeout)])).then(Ok(vec![out(&[7], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 3).await;
        let items = items.unwrap();
        assert!(matches!(items.as_slice(), [Err(EngineError::Timeout(_))]), "{items:?}");
        assert_eq!(script.sent.lock().len(), 1, "the worker took it: not sent again");
    }

    #[tokio::test]
    async fn the_resend_limit_bounds_resends() {
        let script = Script::<PreprocessedRequest>::default();
        script.then(Err(ErrorKind::Unavailable)).then(Err(ErrorKind::Disconnected)).then(Ok(vec![out(&[1], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 1).await;
        assert!(matches!(items, Err(EngineError::Unavailable(_))), "{items:?}");
        assert_eq!(script.sent.lock().len(), 2);
    }

    #[tokio::test]
    async fn engine_errors_and_a_zero_limit_do_not_migrate() {
        let script = Script::<PreprocessedRequest>::default();
        let handler = Err(StreamFailure::Runtime(dynamo_runtime::Error::new(ErrorKind::Handler, "ValueError: x")));
        script.then(Ok(vec![out(&[1], None), handler])).then(Ok(vec![out(&[5], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 3, 3).await;
        assert!(matches!(items.unwrap().last().unwrap(), Err(EngineError::Internal(m)) if m.contains("ValueError")));
        assert_eq!(script.sent.lock().len(), 1);
        let script = Script::<PreprocessedRequest>::default();
        script.then(Ok(vec![out(&[1], None), broken(ErrorKind::Disconnected)])).then(Ok(vec![out(&[5], Some(FinishReason::Stop))]));
        let (items, _) = run(&script, 0, 3).await;
        assert!(matches!(items.unwrap().last().unwrap(), Err(EngineError::Unavailable(_))));
        assert_eq!(script.sent.lock().len(), 1);
    }

    #[tokio::test]
    async fn a_failed_resend_is_an_unavailable_error_naming_both_causes() {
        let script = Script::<PreprocessedRequest>::default();
        script.then(Ok(vec![out(&[1], None), broken(ErrorKind::Disconnected)]));
        let (items, _) = run(&script, 2, 0).await;
        match items.unwrap().last().unwrap() {
            Err(EngineError::Unavailable(m)) => assert!(m.contains("worker gone") && m.contains("no instances"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    type Chunk = crate::protocols::openai::CompletionResponse;

    fn chunk(text: &str, finish: bool) -> Result<StreamItem<Chunk>, StreamFailure> {
        let choice = crate::protocols::openai::CompletionChoice {
            text: text.into(),
            finish_reason: finish.then(|| "stop".into()),
            ..Default::default()
        };
        Ok(StreamItem::new(Chunk::new("c", "m", 1, choice)))
    }

    async fn run_openai(script: &Script<OpenAIRequest<u32, Chunk>>) -> Result<Vec<Result<String, EngineError>>, EngineError> {
        let policy = MigrationPolicy { limit: 3, resend_limit: 3, counter: None };
        let stream = send_resending(script.clone(), OpenAIRequest::new(7), RequestContext::new("r"), policy).await?;
        Ok(stream.map(|item| item.map(|i| i.data.choices[0].text.clone())).collect().await)
    }

    #[tokio::test]
    async fn an_openai_request_not_started_is_resent_whole() {
        let script = Script::<OpenAIRequest<u32, Chunk>>::default();
        script.then(Err(ErrorKind::Unavailable)).then(Ok(vec![broken(ErrorKind::Disconnected)])).then(Ok(vec![chunk("a", false), chunk("b", true)]));
        let texts: Vec<String> = run_openai(&script).await.unwrap().into_iter().map(Result::unwrap).collect();
        assert_eq!(texts, vec!["a", "b"]);
        let sent = script.sent.lock();
        assert_eq!(sent.iter().map(|(q, _)| q.body).collect::<Vec<_>>(), vec![7, 7, 7], "the same request each time");
        assert_eq!(sent[2].1, vec![100, 101]);
    }

    #[tokio::test]
    async fn an_openai_stream_lost_after_its_first_chunk_is_not_continued() {
        let script = Script::<OpenAIRequest<u32, Chunk>>::default();
        script.then(Ok(vec![chunk("a", false), broken(ErrorKind::Disconnected)])).then(Ok(vec![chunk("z", true)]));
        let items = run_openai(&script).await.unwrap();
        assert_eq!(items.len(), 2, "{items:?}");
        assert_eq!(items[0].as_ref().unwrap(), "a");
        assert!(matches!(&items[1], Err(EngineError::Unavailable(_))), "{items:?}");
        assert_eq!(script.sent.lock().len(), 1, "a started OpenAI stream is never sent again");
        assert_eq!(*script.set_aside.lock(), vec![(100, ErrorKind::Disconnected)]);
    }

    #[test]
    fn the_resend_limit_parses_or_says_what_is_wrong() {
        assert_eq!(parse_resend_limit(" 5 "), Ok(5));
        assert_eq!(parse_resend_limit("0"), Ok(0));
        let err = parse_resend_limit("three").unwrap_err().to_string();
        assert!(err.contains("DYN_RESEND_LIMIT") && err.contains("three"), "{err}");
        assert!(parse_resend_limit("-1").is_err());
    }
}

//! Request migration for token-level streams: when the worker serving a request dies,
//! stops answering or times out mid-stream, the request is sent again to another
//! worker with the prompt plus the tokens generated so far, so the client sees one
//! uninterrupted stream (only slower). Bounded by a per-model `migration_limit`.
//!
//! Only failures of the worker or the path to it migrate (`Disconnected`,
//! `Unavailable`, `Timeout` from the runtime). An error the engine itself returned, a
//! malformed item, or a request the caller stopped never does.

use futures::stream::BoxStream;
use futures::StreamExt;
use prometheus::IntCounter;

use dynamo_runtime::ErrorKind;

use crate::engine::{EngineError, RequestContext, TokenStream};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};

use super::wire::decode_error;

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
    fn migratable(&self) -> bool {
        matches!(self, StreamFailure::Runtime(e) if matches!(e.kind(), ErrorKind::Disconnected | ErrorKind::Unavailable | ErrorKind::Timeout))
    }

    pub(crate) fn into_engine_error(self) -> EngineError {
        match self {
            StreamFailure::Runtime(e) => decode_error(e),
            StreamFailure::Decode(e) => e,
        }
    }
}

/// A worker's token stream before migration: outputs, or why it broke.
pub(crate) type WorkerStream = BoxStream<'static, Result<LLMEngineOutput, StreamFailure>>;

/// One sent attempt: the stream and the instance it went to, when known.
pub(crate) struct Attempt {
    pub stream: WorkerStream,
    pub instance: Option<u64>,
}

/// Sends (a continuation of) a request, avoiding the instances in `avoid`.
#[async_trait::async_trait]
pub(crate) trait Resender: Send + Sync + 'static {
    async fn resend(&self, request: PreprocessedRequest, ctx: &RequestContext, avoid: &[u64]) -> Result<Attempt, EngineError>;
}

/// How many times a broken stream is continued elsewhere, and where that is counted.
#[derive(Clone, Default)]
pub struct MigrationPolicy {
    /// Continuations allowed per request (0: none).
    pub limit: u32,
    /// Incremented once per continuation.
    pub counter: Option<IntCounter>,
}

impl std::fmt::Debug for MigrationPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationPolicy").field("limit", &self.limit).finish()
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
    avoid: Vec<u64>,
    generated: Vec<u32>,
    left: u32,
    counter: Option<IntCounter>,
    done: bool,
}

/// The engine stream for `first`, continued on other workers (through `resender`) when
/// it breaks, up to `policy.limit` times. The stream ends when the worker's does; a
/// missing finish reason is left for the detokenizer to report.
pub(crate) fn migrating<R: Resender>(
    resender: R,
    request: PreprocessedRequest,
    ctx: RequestContext,
    first: Attempt,
    policy: MigrationPolicy,
) -> TokenStream {
    let state = State {
        resender,
        request,
        ctx,
        current: first.stream,
        avoid: first.instance.into_iter().collect(),
        generated: Vec::new(),
        left: policy.limit,
        counter: policy.counter,
        done: false,
    };
    futures::stream::unfold(state, |mut st| async move {
        if st.done {
            return None;
        }
        loop {
            match st.current.next().await {
                Some(Ok(out)) => {
                    st.generated.extend_from_slice(&out.token_ids);
                    st.done = out.finish_reason.is_some();
                    return Some((Ok(out), st));
                }
                Some(Err(failure)) if st.left > 0 && failure.migratable() && !st.ctx.is_stopped() => {
                    st.left -= 1;
                    if let Some(c) = &st.counter {
                        c.inc();
                    }
                    let reason = failure.into_engine_error();
                    tracing::warn!(
                        request = st.ctx.id(),
                        generated = st.generated.len(),
                        left = st.left,
                        error = %reason,
                        "worker stream broke; continuing the request on another worker"
                    );
                    let next = continuation(&st.request, &st.generated);
                    match st.resender.resend(next, &st.ctx, &st.avoid).await {
                        Ok(attempt) => {
                            st.avoid.extend(attempt.instance);
                            st.current = attempt.stream;
                        }
                        Err(e) => {
                            st.done = true;
                            let e = EngineError::Unavailable(format!("{reason}; migrating the request failed: {e}"));
                            return Some((Err(e), st));
                        }
                    }
                }
                Some(Err(failure)) => {
                    st.done = true;
                    return Some((Err(failure.into_engine_error()), st));
                }
                None => return None,
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use parking_lot::Mutex;

    use crate::protocols::common::{FinishReason, StopConditions};

    fn out(ids: &[u32], finish: Option<FinishReason>) -> Result<LLMEngineOutput, StreamFailure> {
        Ok(LLMEngineOutput { token_ids: ids.to_vec(), finish_reason: finish, ..Default::default() })
    }

    fn broken(kind: ErrorKind) -> Result<LLMEngineOutput, StreamFailure> {
        Err(StreamFailure::Runtime(dynamo_runtime::Error::new(kind, "worker gone")))
    }

    /// Answers each resend with the next scripted stream and records what it was sent.
    #[derive(Clone, Default)]
    struct Script {
        streams: Arc<Mutex<Vec<Vec<Result<LLMEngineOutput, StreamFailure>>>>>,
        sent: Arc<Mutex<Vec<(PreprocessedRequest, Vec<u64>)>>>,
    }

    #[async_trait::async_trait]
    impl Resender for Script {
        async fn resend(&self, request: PreprocessedRequest, _: &RequestContext, avoid: &[u64]) -> Result<Attempt, EngineError> {
            self.sent.lock().push((request, avoid.to_vec()));
            let mut streams = self.streams.lock();
            if streams.is_empty() {
                return Err(EngineError::Unavailable("no instances".into()));
            }
            let items = streams.remove(0);
            let n = self.sent.lock().len() as u64;
            Ok(Attempt { stream: futures::stream::iter(items).boxed(), instance: Some(100 + n) })
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

    async fn run(first: Vec<Result<LLMEngineOutput, StreamFailure>>, script: &Script, limit: u32) -> Vec<Result<LLMEngineOutput, EngineError>> {
        let counter = IntCounter::new("m", "m").unwrap();
        let policy = MigrationPolicy { limit, counter: Some(counter.clone()) };
        let first = Attempt { stream: futures::stream::iter(first).boxed(), instance: Some(7) };
        let out: Vec<_> = migrating(script.clone(), request(), RequestContext::new("r"), first, policy).collect().await;
        assert_eq!(counter.get() as usize, script.sent.lock().len(), "one count per continuation");
        out
    }

    #[tokio::test]
    async fn a_broken_stream_continues_with_prompt_plus_generated_tokens() {
        let script = Script::default();
        script.streams.lock().push(vec![out(&[12], None), out(&[13], Some(FinishReason::Length))]);
        let items = run(vec![out(&[10], None), out(&[11], None), broken(ErrorKind::Disconnected)], &script, 3).await;
        let ids: Vec<u32> = items.iter().flat_map(|r| r.as_ref().unwrap().token_ids.clone()).collect();
        assert_eq!(ids, vec![10, 11, 12, 13]);
        assert_eq!(items.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Length));
        let sent = script.sent.lock();
        let (next, avoid) = &sent[0];
        assert_eq!(next.token_ids, vec![1, 2, 3, 10, 11]);
        assert_eq!(next.stop_conditions.max_tokens, Some(8));
        assert_eq!(next.stop_conditions.min_tokens, Some(0));
        assert_eq!(next.estimated_prefix_hit_num_blocks, None);
        assert_eq!(avoid, &vec![7], "the failed instance is avoided");
    }

    #[tokio::test]
    async fn the_limit_bounds_continuations() {
        let script = Script::default();
        script.streams.lock().push(vec![broken(ErrorKind::Timeout)]);
        script.streams.lock().push(vec![out(&[5], Some(FinishReason::Stop))]);
        let items = run(vec![broken(ErrorKind::Disconnected)], &script, 1).await;
        assert_eq!(items.len(), 1);
        assert!(matches!(&items[0], Err(EngineError::Timeout(_))), "{items:?}");
        assert_eq!(script.sent.lock().len(), 1);
    }

    #[tokio::test]
    async fn engine_errors_and_a_zero_limit_do_not_migrate() {
        let script = Script::default();
        script.streams.lock().push(vec![out(&[5], Some(FinishReason::Stop))]);
        let handler = Err(StreamFailure::Runtime(dynamo_runtime::Error::new(ErrorKind::Handler, "ValueError: x")));
        let items = run(vec![out(&[1], None), handler], &script, 3).await;
        assert!(matches!(items.last().unwrap(), Err(EngineError::Internal(m)) if m.contains("ValueError")));
        let items = run(vec![broken(ErrorKind::Disconnected)], &script, 0).await;
        assert!(matches!(&items[0], Err(EngineError::Unavailable(_))), "{items:?}");
        assert!(script.sent.lock().is_empty());
    }

    #[tokio::test]
    async fn a_failed_resend_is_an_unavailable_error_naming_both_causes() {
        let script = Script::default();
        let items = run(vec![out(&[1], None), broken(ErrorKind::Disconnected)], &script, 2).await;
        match items.last().unwrap() {
            Err(EngineError::Unavailable(m)) => assert!(m.contains("worker gone") && m.contains("no instances"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

//! [`MockerEngine`]: the mocker as a [`TokenEngine`]. Requests go to the scheduler task;
//! each stream yields one token per simulated step and ends with `length` at
//! `max_tokens`. A stopped context ends the stream with `cancelled`, a killed context
//! or a dropped stream ends it silently; either way the request leaves the scheduler
//! and its blocks are freed.

use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::args::{ArgsError, MockerArgs};
use crate::kv_router::protocols::ForwardPassMetrics;
use super::publisher::{run_publisher, EventSink, MockerPublisher, KV_EVENT_BUFFER};
use super::scheduler::{Command, NewRequest, Scheduler};
use crate::engine::{EngineError, RequestContext, TokenEngine, TokenStream};
use crate::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest, TopLogprob};

/// Tokens generated when a request sets no `max_tokens`.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// A simulated paged-KV-cache LLM engine.
pub struct MockerEngine {
    args: MockerArgs,
    commands: mpsc::UnboundedSender<Command>,
    metrics: watch::Receiver<ForwardPassMetrics>,
    next_id: AtomicU64,
    cancel: CancellationToken,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for MockerEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MockerEngine").field("args", &self.args).finish_non_exhaustive()
    }
}

impl MockerEngine {
    /// Start the scheduler (and, with a publisher, the task that publishes KV events
    /// and load metrics). Must be called inside a tokio runtime.
    pub fn new(args: MockerArgs, publisher: Option<MockerPublisher>) -> Result<Self, ArgsError> {
        args.validate()?;
        let scheduler = Scheduler::new(args.clone());
        let (commands, command_rx) = mpsc::unbounded_channel();
        let (metrics_tx, metrics) = watch::channel(scheduler.metrics());
        let cancel = CancellationToken::new();
        let mut tasks = Vec::new();
        let sink = match publisher {
            Some(publisher) => {
                let (tx, rx) = mpsc::channel(KV_EVENT_BUFFER);
                tasks.push(tokio::spawn(run_publisher(publisher, rx, metrics.clone(), cancel.clone())));
                EventSink::new(Some(tx))
            }
            None => EventSink::new(None),
        };
        tasks.push(tokio::spawn(scheduler.run(command_rx, sink, metrics_tx, cancel.clone())));
        Ok(MockerEngine { args, commands, metrics, next_id: AtomicU64::new(0), cancel, tasks: Mutex::new(tasks) })
    }

    /// The configuration.
    pub fn args(&self) -> &MockerArgs {
        &self.args
    }

    /// The current load (as last published by the scheduler).
    pub fn metrics(&self) -> ForwardPassMetrics {
        self.metrics.borrow().clone()
    }

    /// Hand a command to the scheduler task.
    pub(crate) fn send_command(&self, command: Command) -> Result<(), mpsc::error::SendError<Command>> {
        self.commands.send(command)
    }

    /// Stop the scheduler and publisher and wait for them; streams still open end with
    /// an error.
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let tasks = std::mem::take(&mut *self.tasks.lock());
        for task in tasks {
            let _ = task.await;
        }
    }

    fn check(&self, request: &PreprocessedRequest) -> Result<usize, EngineError> {
        if self.cancel.is_cancelled() {
            return Err(EngineError::Unavailable("mocker engine shut down".to_string()));
        }
        if request.token_ids.is_empty() {
            return Err(EngineError::BadRequest("the prompt has no tokens".to_string()));
        }
        let max_tokens = request.stop_conditions.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS) as usize;
        if max_tokens == 0 {
            return Err(EngineError::BadRequest("max_tokens must be at least 1".to_string()));
        }
        let args = &self.args;
        let usable = args.num_gpu_blocks - args.watermark_blocks();
        let prompt = request.token_ids.len();
        if (prompt + 1).div_ceil(args.block_size) > usable {
            return Err(EngineError::BadRequest(format!(
                "prompt of {prompt} tokens does not fit in the KV cache ({usable} usable blocks of {} tokens)",
                args.block_size
            )));
        }
        if !args.enable_chunked_prefill && prompt > args.max_num_batched_tokens {
            return Err(EngineError::BadRequest(format!(
                "prompt of {prompt} tokens exceeds max_num_batched_tokens ({}) and chunked prefill is off",
                args.max_num_batched_tokens
            )));
        }
        Ok(max_tokens)
    }
}

impl Drop for MockerEngine {
    fn drop(&mut self) {
        self.cancel.cancel();
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

#[async_trait]
impl TokenEngine for MockerEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let max_tokens = self.check(&request)?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let seed = match request.sampling_options.seed {
            Some(seed) => seed as u64,
            None => self.args.seed ^ id.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        };
        let logprobs = request.output_options.logprobs;
        let (output, rx) = mpsc::unbounded_channel();
        let add = Command::Add(NewRequest { id, tokens: request.token_ids, max_tokens, seed, output });
        self.commands
            .send(add)
            .map_err(|_| EngineError::Unavailable("mocker engine shut down".to_string()))?;
        let guard = CancelOnDrop { id, commands: Some(self.commands.clone()) };
        let state = StreamState { rx, ctx, guard, done: false, logprobs };
        Ok(Box::pin(futures::stream::unfold(state, next_item)))
    }
}

/// Tells the scheduler to drop a request when its stream ends early or is dropped.
struct CancelOnDrop {
    id: u64,
    commands: Option<mpsc::UnboundedSender<Command>>,
}

impl CancelOnDrop {
    fn cancel_now(&mut self) {
        if let Some(commands) = self.commands.take() {
            let _ = commands.send(Command::Cancel(self.id));
        }
    }

    /// The request finished in the scheduler: nothing to cancel.
    fn disarm(&mut self) {
        self.commands = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.cancel_now();
    }
}

struct StreamState {
    rx: mpsc::UnboundedReceiver<Result<LLMEngineOutput, EngineError>>,
    ctx: RequestContext,
    guard: CancelOnDrop,
    done: bool,
    /// Alternatives per token when the client asked for log probabilities.
    logprobs: Option<u32>,
}

/// Simulated log probabilities for `out`'s tokens: each token the most likely, a value
/// derived from its id, `top` alternatives (the token first) at lower values.
fn add_logprobs(out: &mut LLMEngineOutput, top: u32) {
    let logprob = |id: u32| -f64::from(id % 97 + 1) / 100.0;
    out.log_probs = Some(out.token_ids.iter().map(|&id| logprob(id)).collect());
    out.top_log_probs = Some(
        out.token_ids
            .iter()
            .map(|&id| {
                (0..top)
                    .map(|k| TopLogprob { token_id: id.wrapping_add(k), logprob: logprob(id) - f64::from(k) })
                    .collect()
            })
            .collect(),
    );
}

async fn next_item(mut st: StreamState) -> Option<(Result<LLMEngineOutput, EngineError>, StreamState)> {
    if st.done {
        return None;
    }
    tokio::select! {
        biased;
        _ = st.ctx.stopped() => {
            st.done = true;
            st.guard.cancel_now();
            if st.ctx.is_killed() {
                return None;
            }
            let last = LLMEngineOutput { finish_reason: Some(FinishReason::Cancelled), ..Default::default() };
            Some((Ok(last), st))
        }
        item = st.rx.recv() => {
            st.done = true;
            let item = match item {
                Some(Ok(mut out)) => {
                    st.done = out.finish_reason.is_some();
                    if let Some(top) = st.logprobs {
                        add_logprobs(&mut out, top);
                    }
                    Ok(out)
                }
                Some(item) => item,
                None => Err(EngineError::Unavailable("mocker engine shut down".to_string())),
            };
            if st.done {
                st.guard.disarm();
            }
            Some((item, st))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;
    use crate::protocols::common::StopConditions;

    fn engine(json: &str) -> MockerEngine {
        let mut args = MockerArgs::from_json(json).unwrap();
        args.speedup_ratio = 1000.0;
        MockerEngine::new(args, None).unwrap()
    }

    fn request(tokens: Vec<u32>, max_tokens: Option<u32>) -> PreprocessedRequest {
        PreprocessedRequest {
            token_ids: tokens,
            stop_conditions: StopConditions { max_tokens, ..Default::default() },
            ..Default::default()
        }
    }

    async fn collect(engine: &MockerEngine, req: PreprocessedRequest) -> Vec<LLMEngineOutput> {
        let stream = engine.generate(req, RequestContext::new("t")).await.unwrap();
        let items: Vec<_> = tokio::time::timeout(Duration::from_secs(20), stream.collect()).await.expect("stream finished");
        items.into_iter().map(|i| i.unwrap()).collect()
    }

    #[tokio::test]
    async fn logprobs_come_with_every_token_when_asked() {
        let engine = engine("{}");
        let mut req = request(vec![5, 6, 7], Some(4));
        req.output_options.logprobs = Some(2);
        let out = collect(&engine, req).await;
        let tokens: usize = out.iter().map(|o| o.token_ids.len()).sum();
        let logprobs: usize = out.iter().filter_map(|o| o.log_probs.as_ref()).map(Vec::len).sum();
        assert_eq!((tokens, logprobs), (4, 4));
        let tops = out.iter().filter_map(|o| o.top_log_probs.as_ref()).flatten();
        assert!(tops.clone().all(|alts| alts.len() == 2 && alts[0].logprob > alts[1].logprob));
        assert!(collect(&engine, request(vec![5], Some(2))).await.iter().all(|o| o.log_probs.is_none()));
        engine.shutdown().await;
    }

    /// Wait (bounded) until the metrics satisfy `f`.
    async fn wait_metrics(engine: &MockerEngine, f: impl Fn(&ForwardPassMetrics) -> bool) -> ForwardPassMetrics {
        tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let m = engine.metrics();
                if f(&m) {
                    return m;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("metrics condition reached")
    }

    #[tokio::test]
    async fn stream_yields_max_tokens_then_length() {
        let engine = engine("{}");
        let items = collect(&engine, request((0..100).collect(), Some(7))).await;
        assert_eq!(items.len(), 7);
        assert!(items.iter().all(|i| i.token_ids.len() == 1));
        assert!(items[..6].iter().all(|i| i.finish_reason.is_none()));
        assert_eq!(items[6].finish_reason, Some(FinishReason::Length));
        let items = collect(&engine, request(vec![1, 2, 3], None)).await;
        assert_eq!(items.len(), DEFAULT_MAX_TOKENS as usize);
        let with_seed = |seed| PreprocessedRequest {
            sampling_options: crate::protocols::common::SamplingOptions { seed: Some(seed), ..Default::default() },
            ..request(vec![5; 10], Some(5))
        };
        assert_eq!(collect(&engine, with_seed(9)).await, collect(&engine, with_seed(9)).await);
        engine.shutdown().await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_requests_all_finish() {
        let engine = std::sync::Arc::new(engine(r#"{"max_num_seqs": 8, "num_gpu_blocks": 64}"#));
        let tasks: Vec<_> = (0..32u32)
            .map(|i| {
                let engine = engine.clone();
                tokio::spawn(async move {
                    let prompt: Vec<u32> = (0..16).chain(i * 100..i * 100 + 40).collect();
                    collect(&engine, request(prompt, Some(10))).await
                })
            })
            .collect();
        for task in tasks {
            let items = task.await.unwrap();
            assert_eq!(items.len(), 10);
            assert_eq!(items[9].finish_reason, Some(FinishReason::Length));
        }
        let m = wait_metrics(&engine, |m| m.request_active_slots == 0).await;
        assert_eq!((m.kv_active_blocks, m.num_requests_waiting), (0, 0));
        assert!(m.gpu_prefix_cache_hit_rate > 0.0, "the shared first block was reused");
        engine.shutdown().await;
    }

    #[tokio::test]
    async fn stop_kill_and_drop_free_blocks() {
        let engine = engine("{}");
        // Stop: the stream ends with `cancelled`.
        let ctx = RequestContext::new("stop");
        let mut stream = engine.generate(request((0..100).collect(), Some(100_000)), ctx.clone()).await.unwrap();
        stream.next().await.unwrap().unwrap();
        assert!(engine.metrics().kv_active_blocks > 0);
        ctx.stop_generating();
        let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>()).await.unwrap();
        assert_eq!(rest.last().unwrap().as_ref().unwrap().finish_reason, Some(FinishReason::Cancelled));
        wait_metrics(&engine, |m| m.kv_active_blocks == 0 && m.request_active_slots == 0).await;

        // Kill: the stream just ends.
        let ctx = RequestContext::new("kill");
        let mut stream = engine.generate(request((0..100).collect(), Some(100_000)), ctx.clone()).await.unwrap();
        stream.next().await.unwrap().unwrap();
        ctx.kill();
        assert!(tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().is_none());
        wait_metrics(&engine, |m| m.kv_active_blocks == 0).await;

        // Drop.
        let mut stream = engine.generate(request((0..100).collect(), Some(100_000)), RequestContext::new("d")).await.unwrap();
        stream.next().await.unwrap().unwrap();
        drop(stream);
        wait_metrics(&engine, |m| m.kv_active_blocks == 0 && m.request_active_slots == 0).await;
        engine.shutdown().await;
    }

    #[tokio::test]
    async fn bad_requests_are_refused() {
        let engine = engine(r#"{"num_gpu_blocks": 10, "block_size": 16}"#);
        let err = engine.generate(request((0..1000).collect(), Some(1)), RequestContext::new("t")).await.err().unwrap();
        assert!(matches!(&err, EngineError::BadRequest(m) if m.contains("does not fit")), "{err:?}");
        assert_eq!(err.status(), 400);
        let err = engine.generate(request(vec![], Some(1)), RequestContext::new("t")).await.err().unwrap();
        assert!(matches!(err, EngineError::BadRequest(_)));
        let err = engine.generate(request(vec![1], Some(0)), RequestContext::new("t")).await.err().unwrap();
        assert!(matches!(err, EngineError::BadRequest(_)));
        let strict = self::engine(r#"{"max_num_batched_tokens": 32, "enable_chunked_prefill": false}"#);
        let err = strict.generate(request((0..33).collect(), Some(1)), RequestContext::new("t")).await.err().unwrap();
        assert!(matches!(&err, EngineError::BadRequest(m) if m.contains("chunked")), "{err:?}");
        engine.shutdown().await;
        let err = engine.generate(request(vec![1], Some(1)), RequestContext::new("t")).await.err().unwrap();
        assert!(matches!(err, EngineError::Unavailable(_)));
    }

    #[tokio::test]
    async fn shutdown_fails_open_streams() {
        let engine = engine("{}");
        let mut stream = engine.generate(request((0..10).collect(), Some(1_000_000)), RequestContext::new("t")).await.unwrap();
        stream.next().await.unwrap().unwrap();
        engine.shutdown().await;
        let rest: Vec<_> = tokio::time::timeout(Duration::from_secs(10), stream.collect::<Vec<_>>()).await.unwrap();
        assert!(matches!(rest.last(), Some(Err(EngineError::Unavailable(_)))), "{rest:?}");
    }
}

//! The prefill role: take jobs from the prefill queue, at most
//! `max_concurrent_prefills` at a time, compute each prompt's KV and answer with its
//! [`KvTransferDescriptor`](super::KvTransferDescriptor). Jobs arrive on the worker's
//! endpoint (request plane) and, when the event plane is NATS, are also pulled from the
//! JetStream stream.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use dynamo_runtime::config::EventPlane;
use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::Endpoint;
use futures::stream::BoxStream;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use super::config::DisaggConfig;
use super::handoff::{KvPrefill, PrefillEvent, PrefillJob};
use super::jetstream::JetStreamQueue;
use super::metrics::DisaggMetrics;
use crate::engine::RequestContext;
use crate::protocols::common::{PreprocessedRequest, StopConditions};

/// How long one pull from the JetStream queue waits for a job.
const PULL_WAIT: Duration = Duration::from_secs(1);

/// Runs prefill jobs on the engine.
#[derive(Clone)]
struct JobRunner {
    engine: Arc<dyn KvPrefill>,
    slots: Arc<Semaphore>,
    worker_id: u64,
    metrics: DisaggMetrics,
}

pub(crate) fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl JobRunner {
    async fn slot(&self) -> Option<OwnedSemaphorePermit> {
        self.slots.clone().acquire_owned().await.ok()
    }

    async fn run(&self, job: PrefillJob, ctx: RequestContext) -> PrefillEvent {
        if unix_ms() > job.deadline_unix_ms {
            self.metrics.job("expired");
            return PrefillEvent::Failed { message: format!("prefill job {} expired in the queue", job.request_id) };
        }
        let request = PreprocessedRequest {
            token_ids: job.token_ids,
            stop_conditions: StopConditions { max_tokens: Some(1), ..Default::default() },
            ..Default::default()
        };
        // Past the deadline the decode worker prefills locally: stop computing (dropping
        // the engine's future cancels it).
        let left = Duration::from_millis(job.deadline_unix_ms.saturating_sub(unix_ms()));
        match tokio::time::timeout(left, self.engine.prefill_for_transfer(request, ctx, self.worker_id)).await {
            Ok(Ok(mut descriptor)) => {
                self.metrics.job("done");
                descriptor.request_id = job.request_id;
                PrefillEvent::Done(descriptor)
            }
            Ok(Err(e)) => {
                self.metrics.job("failed");
                PrefillEvent::Failed { message: format!("prefill failed: {e}") }
            }
            Err(_) => {
                self.metrics.job("expired");
                PrefillEvent::Failed { message: format!("prefill job {} ran past its deadline", job.request_id) }
            }
        }
    }
}

/// A running prefill worker; dropping it (or [`PrefillWorker::shutdown`]) stops pulling
/// from the JetStream queue. The endpoint serves until the runtime shuts down.
pub struct PrefillWorker {
    cancel: CancellationToken,
    puller: Mutex<Option<JoinHandle<()>>>,
}

impl PrefillWorker {
    /// Stop pulling jobs and wait for the puller (its jobs in flight are abandoned).
    pub async fn shutdown(&self) {
        self.cancel.cancel();
        let puller = self.puller.lock().take();
        if let Some(task) = puller {
            let _ = task.await;
        }
    }
}

impl Drop for PrefillWorker {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.puller.get_mut().take() {
            task.abort();
        }
    }
}

enum Step {
    Queued(PrefillJob, RequestContext),
    Running(PrefillJob, RequestContext, OwnedSemaphorePermit),
    End,
}

/// Serve the prefill role on `endpoint` (and pull from the JetStream queue when the
/// runtime's event plane is NATS). Returns once the endpoint is discoverable.
pub async fn serve_prefill_worker(
    endpoint: &Endpoint,
    engine: Arc<dyn KvPrefill>,
    config: &DisaggConfig,
    metrics: DisaggMetrics,
) -> dynamo_runtime::Result<PrefillWorker> {
    let runtime = endpoint.planes().clone();
    let runner = JobRunner {
        engine,
        slots: Arc::new(Semaphore::new(config.max_concurrent_prefills.max(1))),
        worker_id: runtime.instance_id(),
        metrics,
    };
    let cancel = runtime.child_token();
    let puller = match (runtime.config().event_plane, runtime.nats()) {
        (EventPlane::Nats, Some(nats)) => {
            let queue = JetStreamQueue::open(nats.clone(), &endpoint.id().namespace).await?;
            Some(tokio::spawn(pull_loop(queue, runner.clone(), cancel.clone())))
        }
        _ => None,
    };
    let handler_runner = runner.clone();
    endpoint
        .start(stream_handler(move |job: PrefillJob, ctx: RequestContext| -> BoxStream<'static, Result<PrefillEvent, String>> {
            let runner = handler_runner.clone();
            futures::stream::unfold(Step::Queued(job, ctx), move |step| {
                let runner = runner.clone();
                async move {
                    match step {
                        Step::Queued(job, ctx) => {
                            let permit = runner.slot().await?;
                            Some((Ok(PrefillEvent::Started { worker: runner.worker_id }), Step::Running(job, ctx, permit)))
                        }
                        Step::Running(job, ctx, permit) => {
                            let event = runner.run(job, ctx).await;
                            drop(permit);
                            Some((Ok(event), Step::End))
                        }
                        Step::End => None,
                    }
                }
            })
            .boxed()
        }))
        .await?;
    Ok(PrefillWorker { cancel, puller: Mutex::new(puller) })
}

/// Pull jobs while a slot is free; each runs in its own task, answered on its inbox.
async fn pull_loop(queue: JetStreamQueue, runner: JobRunner, cancel: CancellationToken) {
    let mut running = JoinSet::new();
    loop {
        while running.try_join_next().is_some() {}
        let permit = tokio::select! {
            _ = cancel.cancelled() => break,
            permit = runner.slot() => match permit { Some(p) => p, None => break },
        };
        let pulled = tokio::select! {
            _ = cancel.cancelled() => break,
            pulled = queue.pull(PULL_WAIT) => pulled,
        };
        match pulled {
            Ok(Some(job)) => {
                let (queue, runner) = (queue.clone(), runner.clone());
                running.spawn(async move {
                    queue.answer(&job, &PrefillEvent::Started { worker: runner.worker_id }).await;
                    let ctx = RequestContext::new(job.request_id.clone());
                    let event = runner.run(job.clone(), ctx).await;
                    queue.answer(&job, &event).await;
                    drop(permit);
                });
            }
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "prefill queue");
                tokio::select! {
                    _ = cancel.cancelled() => break,
                    _ = tokio::time::sleep(PULL_WAIT) => {}
                }
            }
        }
    }
    running.abort_all();
    while running.join_next().await.is_some() {}
}

//! The decode side of the prefill queue: put a job in, wait (bounded) for its KV
//! transfer descriptor, and tell how many jobs wait.
//!
//! - Request plane (the embedded default): the job is a request to a prefill worker's
//!   endpoint, round-robin; the worker queues it until one of its prefill slots frees
//!   and answers `started`, then `done`. The queue size this worker sees is its own
//!   jobs not yet started.
//! - JetStream (when the event plane is NATS): the job goes into the durable stream
//!   `{namespace}_prefill_queue` that prefill workers pull from; the answer comes back
//!   on a NATS inbox. The queue size is the stream consumer's pending count, the same
//!   for every decode worker.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use dynamo_runtime::config::EventPlane;
use dynamo_runtime::typed::decode_item;
use dynamo_runtime::{Client, EndpointId, Planes};

use super::handoff::{KvTransferDescriptor, PrefillEvent, PrefillJob};
use super::jetstream::JetStreamQueue;
use crate::engine::EngineError;

/// Which transport a [`PrefillQueue`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillQueueKind {
    /// Requests to prefill workers' endpoint (embedded default).
    RequestPlane,
    /// A durable NATS JetStream stream.
    JetStream,
}

/// The prefill workers' endpoint a decode worker of `namespace` uses unless told
/// otherwise: `{namespace}.prefill.generate`.
pub fn default_prefill_endpoint(namespace: &str) -> dynamo_runtime::Result<EndpointId> {
    EndpointId::parse(&format!("{namespace}.prefill.generate"))
}

/// Where a decode worker sends prefill jobs.
pub struct PrefillQueue {
    /// The prefill workers' endpoint (also tells whether any is up).
    client: Client,
    jetstream: Option<JetStreamQueue>,
    /// Request plane: jobs sent and not yet started.
    waiting: Arc<AtomicUsize>,
}

impl std::fmt::Debug for PrefillQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefillQueue").field("endpoint", self.client.endpoint()).field("kind", &self.kind()).finish()
    }
}

impl PrefillQueue {
    /// The queue of the prefill workers serving `prefill_endpoint`: JetStream when the
    /// runtime's event plane is NATS (the server must have JetStream enabled), else
    /// the request plane.
    pub async fn connect(runtime: &Planes, prefill_endpoint: &EndpointId) -> dynamo_runtime::Result<Self> {
        let endpoint = runtime
            .namespace(prefill_endpoint.namespace.clone())?
            .component(prefill_endpoint.component.clone())?
            .endpoint(prefill_endpoint.name.clone())?;
        let client = endpoint.client().await?;
        let jetstream = match (runtime.config().event_plane, runtime.nats()) {
            (EventPlane::Nats, Some(nats)) => Some(JetStreamQueue::open(nats.clone(), &prefill_endpoint.namespace).await?),
            _ => None,
        };
        Ok(PrefillQueue { client, jetstream, waiting: Arc::new(AtomicUsize::new(0)) })
    }

    /// The transport in use.
    pub fn kind(&self) -> PrefillQueueKind {
        if self.jetstream.is_some() {
            PrefillQueueKind::JetStream
        } else {
            PrefillQueueKind::RequestPlane
        }
    }

    /// Whether any prefill worker is up (discovery's view).
    pub fn has_workers(&self) -> bool {
        !self.client.routable_instance_ids().is_empty()
    }

    /// Jobs waiting for a prefill worker. When it cannot be read, `usize::MAX` (the
    /// decision rule then prefills locally).
    pub async fn size(&self) -> usize {
        match &self.jetstream {
            Some(js) => js.pending().await.unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot read the prefill queue's size");
                usize::MAX
            }),
            None => self.waiting.load(Ordering::Acquire),
        }
    }

    /// Queue `job` and wait for its descriptor, at most `timeout`.
    pub async fn submit(&self, job: PrefillJob, timeout: Duration) -> Result<KvTransferDescriptor, EngineError> {
        let request_id = job.request_id.clone();
        let wait = async {
            match &self.jetstream {
                Some(js) => js.submit(job).await,
                None => self.submit_request(job).await,
            }
        };
        tokio::time::timeout(timeout, wait).await.unwrap_or_else(|_| {
            Err(EngineError::Timeout(format!("remote prefill of request {request_id} took longer than {timeout:?}")))
        })
    }

    async fn submit_request(&self, job: PrefillJob) -> Result<KvTransferDescriptor, EngineError> {
        let body = serde_json::to_vec(&job).map_err(|e| EngineError::Internal(format!("prefill job: {e}")))?;
        let mut waiting = WaitingGuard::new(self.waiting.clone());
        let mut stream = self.client.round_robin(Bytes::from(body)).await?;
        while let Some(item) = stream.next().await {
            let event: PrefillEvent = decode_item(&item?)?;
            match event {
                PrefillEvent::Started { .. } => waiting.release(),
                PrefillEvent::Done(descriptor) => return Ok(descriptor),
                PrefillEvent::Failed { message } => return Err(EngineError::Unavailable(message)),
            }
        }
        Err(EngineError::Unavailable("the prefill worker ended the job without a result".to_string()))
    }
}

/// Counts a job as waiting until it starts or is given up.
struct WaitingGuard {
    count: Option<Arc<AtomicUsize>>,
}

impl WaitingGuard {
    fn new(count: Arc<AtomicUsize>) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        WaitingGuard { count: Some(count) }
    }

    fn release(&mut self) {
        if let Some(count) = self.count.take() {
            count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.release();
    }
}

//! Publishing an engine's KV events and load metrics on its component's event plane
//! (`kv_events`, `load_metrics`). Callers never wait for the network: KV events go
//! through a bounded channel (dropped, with a warning, when it is full; the gap shows in
//! `event_id`) and metrics through a watch channel (only the latest value matters) to a
//! publisher task.

use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::Component;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::lossy_sender::LossySender;
use super::protocols::{
    ForwardPassMetrics, KvCacheEvent, LoadMetricsEvent, RouterEvent, KV_EVENTS_SUBJECT, LOAD_METRICS_SUBJECT,
};

/// Load metrics are published at most this often (when they change)...
pub const METRICS_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// ...and at least this often (even when they do not).
pub const METRICS_MAX_INTERVAL: Duration = Duration::from_secs(1);
/// KV events buffered for the publisher task before new ones are dropped.
pub const KV_EVENT_BUFFER: usize = 4096;

/// Publish `events` as they come and `metrics` when they change (at most every
/// [`METRICS_MIN_INTERVAL`], at least every [`METRICS_MAX_INTERVAL`]) as `worker_id` on
/// `component`, until cancelled or both inputs are closed.
pub async fn run_publisher(
    component: Component,
    worker_id: u64,
    mut events: Option<mpsc::Receiver<KvCacheEvent>>,
    mut metrics: Option<watch::Receiver<ForwardPassMetrics>>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(METRICS_MIN_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last: Option<(Instant, ForwardPassMetrics)> = None;
    loop {
        if events.is_none() && metrics.is_none() {
            return;
        }
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tick.tick(), if metrics.is_some() => {
                let Some(rx) = metrics.as_mut() else { continue };
                if rx.has_changed().is_err() {
                    metrics = None; // the sender is gone
                    continue;
                }
                let now = rx.borrow_and_update().clone();
                let due = match &last {
                    None => true,
                    Some((at, sent)) => *sent != now || at.elapsed() >= METRICS_MAX_INTERVAL,
                };
                if due {
                    publish(&component, LOAD_METRICS_SUBJECT, &LoadMetricsEvent { worker_id, metrics: now.clone() }).await;
                    last = Some((Instant::now(), now));
                }
            }
            event = async { events.as_mut()?.recv().await }, if events.is_some() => match event {
                Some(event) => publish(&component, KV_EVENTS_SUBJECT, &RouterEvent { worker_id, event }).await,
                None => events = None,
            },
        }
    }
}

async fn publish(component: &Component, subject: &str, value: &impl serde::Serialize) {
    let payload = match serde_json::to_vec(value) {
        Ok(payload) => Bytes::from(payload),
        Err(e) => {
            tracing::error!(subject, error = %e, "cannot encode event");
            return;
        }
    };
    if let Err(e) = component.publish(subject, payload).await {
        tracing::warn!(subject, error = %e, "cannot publish a KV router event");
    }
}

/// An engine's KV events, published as one worker of a component. Sending never
/// blocks; the events drain in the background, also after the publisher is dropped.
#[derive(Debug)]
pub struct KvEventPublisher {
    worker_id: u64,
    events: LossySender<KvCacheEvent>,
    _task: JoinHandle<()>,
}

/// What a KV event publisher that falls behind logs.
pub(crate) const KV_EVENTS_BEHIND: &str = "KV event publisher is behind; dropping KV events";

impl KvEventPublisher {
    /// Start publishing on `component` as `worker_id` (the instance id of the worker's
    /// endpoint). Must be called within a tokio runtime.
    pub fn new(component: Component, worker_id: u64) -> Self {
        let (tx, rx) = mpsc::channel(KV_EVENT_BUFFER);
        let task = tokio::spawn(run_publisher(component, worker_id, Some(rx), None, CancellationToken::new()));
        KvEventPublisher { worker_id, events: LossySender::new(tx, KV_EVENTS_BEHIND), _task: task }
    }

    /// The worker id the events carry.
    pub fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// Queue `event`; `false` (and a warning) when the queue is full and it was dropped.
    pub fn publish(&self, event: KvCacheEvent) -> bool {
        self.events.send(event)
    }
}

/// An engine's load metrics, published as one worker of a component: the latest value
/// goes out when it changes (at most every [`METRICS_MIN_INTERVAL`]) and at least every
/// [`METRICS_MAX_INTERVAL`]. Publishing stops when it is dropped.
#[derive(Debug)]
pub struct WorkerMetricsPublisher {
    tx: watch::Sender<ForwardPassMetrics>,
    cancel: CancellationToken,
    _task: JoinHandle<()>,
}

impl WorkerMetricsPublisher {
    /// Start publishing on `component` as `worker_id`, beginning with `initial`. Must be
    /// called within a tokio runtime.
    pub fn new(component: Component, worker_id: u64, initial: ForwardPassMetrics) -> Self {
        let (tx, rx) = watch::channel(initial);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_publisher(component, worker_id, None, Some(rx), cancel.clone()));
        WorkerMetricsPublisher { tx, cancel, _task: task }
    }

    /// Replace the published metrics.
    pub fn publish(&self, metrics: ForwardPassMetrics) {
        self.tx.send_replace(metrics);
    }
}

impl Drop for WorkerMetricsPublisher {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

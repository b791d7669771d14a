//! Publishing a mocker's KV events and load metrics on its component's event plane.
//! The scheduler never waits for the network: KV events go through a bounded channel
//! (dropped, with a warning, when it is full; the gap shows in `event_id`) and metrics
//! through a watch channel (only the latest value matters) to a publisher task.

use std::time::Duration;

use bytes::Bytes;
use dynamo_runtime::Component;
use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::kv_router::protocols::{
    ForwardPassMetrics, KvCacheEvent, KvCacheEventData, LoadMetricsEvent, RouterEvent, KV_EVENTS_SUBJECT, LOAD_METRICS_SUBJECT,
};

/// Load metrics are published at most this often (when they change)...
pub const METRICS_MIN_INTERVAL: Duration = Duration::from_millis(100);
/// ...and at least this often (even when they do not).
pub const METRICS_MAX_INTERVAL: Duration = Duration::from_secs(1);
/// KV events buffered for the publisher task before new ones are dropped.
pub(crate) const KV_EVENT_BUFFER: usize = 4096;

/// Where a mocker publishes: a component's event plane, as one worker.
#[derive(Debug, Clone)]
pub struct MockerPublisher {
    /// The worker's component; events go on its `kv_events` and `load_metrics` subjects.
    pub component: Component,
    /// The instance id of the worker's endpoint (routers key their index by it).
    pub worker_id: u64,
}

impl MockerPublisher {
    /// A publisher for `worker_id` on `component`.
    pub fn new(component: Component, worker_id: u64) -> Self {
        MockerPublisher { component, worker_id }
    }
}

/// Numbers KV events and hands them to the publisher task without blocking.
#[derive(Debug)]
pub(crate) struct EventSink {
    next_id: u64,
    tx: Option<mpsc::Sender<KvCacheEvent>>,
    dropped: u64,
}

impl EventSink {
    /// A sink feeding `tx`, or discarding everything when `None`.
    pub(crate) fn new(tx: Option<mpsc::Sender<KvCacheEvent>>) -> Self {
        EventSink { next_id: 0, tx, dropped: 0 }
    }

    /// Number and forward one event.
    pub(crate) fn send(&mut self, data: KvCacheEventData) {
        let event = KvCacheEvent { event_id: self.next_id, data };
        self.next_id += 1;
        let Some(tx) = &self.tx else { return };
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(event) {
            self.dropped += 1;
            if self.dropped.is_power_of_two() {
                tracing::warn!(dropped = self.dropped, "KV event publisher is behind; dropping KV events");
            }
        }
    }
}

/// Publish KV events as they come and metrics when they change (at most every
/// [`METRICS_MIN_INTERVAL`], at least every [`METRICS_MAX_INTERVAL`]) until cancelled.
pub(crate) async fn run_publisher(
    publisher: MockerPublisher,
    mut events: mpsc::Receiver<KvCacheEvent>,
    mut metrics: watch::Receiver<ForwardPassMetrics>,
    cancel: CancellationToken,
) {
    let mut tick = tokio::time::interval(METRICS_MIN_INTERVAL);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last: Option<(Instant, ForwardPassMetrics)> = None;
    loop {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {
                let now = metrics.borrow_and_update().clone();
                let due = match &last {
                    None => true,
                    Some((at, sent)) => *sent != now || at.elapsed() >= METRICS_MAX_INTERVAL,
                };
                if due {
                    let event = LoadMetricsEvent { worker_id: publisher.worker_id, metrics: now.clone() };
                    publish(&publisher, LOAD_METRICS_SUBJECT, &event).await;
                    last = Some((Instant::now(), now));
                }
            }
            event = events.recv() => match event {
                Some(event) => {
                    let event = RouterEvent { worker_id: publisher.worker_id, event };
                    publish(&publisher, KV_EVENTS_SUBJECT, &event).await;
                }
                None => return,
            },
        }
    }
}

async fn publish(publisher: &MockerPublisher, subject: &str, value: &impl serde::Serialize) {
    let payload = match serde_json::to_vec(value) {
        Ok(payload) => Bytes::from(payload),
        Err(e) => {
            tracing::error!(subject, error = %e, "cannot encode event");
            return;
        }
    };
    if let Err(e) = publisher.component.publish(subject, payload).await {
        tracing::warn!(subject, error = %e, "cannot publish mocker event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sink_numbers_events_and_drops_when_full() {
        let (tx, mut rx) = mpsc::channel(2);
        let mut sink = EventSink::new(Some(tx));
        for _ in 0..3 {
            sink.send(KvCacheEventData::Cleared);
        }
        assert_eq!(rx.try_recv().unwrap().event_id, 0);
        assert_eq!(rx.try_recv().unwrap().event_id, 1);
        assert!(rx.try_recv().is_err(), "the third event was dropped");
        assert_eq!(sink.dropped, 1);
        sink.send(KvCacheEventData::Cleared);
        assert_eq!(rx.try_recv().unwrap().event_id, 3, "the gap shows in event_id");
        let mut discard = EventSink::new(None);
        discard.send(KvCacheEventData::Cleared);
    }
}

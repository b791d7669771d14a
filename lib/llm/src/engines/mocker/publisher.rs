//! Publishing a mocker's KV events and load metrics on its component's event plane.
//! The scheduler never waits for the network: KV events are numbered here and handed to
//! the publisher task through the kv_router's lossy sender (dropped, with a warning, when
//! it is behind; the gap shows in `event_id`), metrics through a watch channel (only the
//! latest value matters).

use dynamo_runtime::Component;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::kv_router::lossy_sender::LossySender;
use crate::kv_router::protocols::{ForwardPassMetrics, KvCacheEvent, KvCacheEventData};
use crate::kv_router::publisher::KV_EVENTS_BEHIND;
pub use crate::kv_router::publisher::{KV_EVENT_BUFFER, METRICS_MAX_INTERVAL, METRICS_MIN_INTERVAL};

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
    events: Option<LossySender<KvCacheEvent>>,
}

impl EventSink {
    /// A sink feeding `tx`, or discarding everything when `None`.
    pub(crate) fn new(tx: Option<mpsc::Sender<KvCacheEvent>>) -> Self {
        EventSink { next_id: 0, events: tx.map(|tx| LossySender::new(tx, KV_EVENTS_BEHIND)) }
    }

    /// Number and forward one event.
    pub(crate) fn send(&mut self, data: KvCacheEventData) {
        let event = KvCacheEvent { event_id: self.next_id, data };
        self.next_id += 1;
        if let Some(events) = &self.events {
            events.send(event);
        }
    }

    /// Events dropped because the publisher task was behind.
    #[cfg(test)]
    fn dropped(&self) -> u64 {
        self.events.as_ref().map_or(0, LossySender::dropped)
    }
}

/// Publish the mocker's KV events and metrics until cancelled
/// ([`crate::kv_router::publisher::run_publisher`]).
pub(crate) async fn run_publisher(
    publisher: MockerPublisher,
    events: mpsc::Receiver<KvCacheEvent>,
    metrics: watch::Receiver<ForwardPassMetrics>,
    cancel: CancellationToken,
) {
    crate::kv_router::publisher::run_publisher(publisher.component, publisher.worker_id, Some(events), Some(metrics), cancel)
        .await
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
        assert_eq!(sink.dropped(), 1);
        sink.send(KvCacheEventData::Cleared);
        assert_eq!(rx.try_recv().unwrap().event_id, 3, "the gap shows in event_id");
        let mut discard = EventSink::new(None);
        discard.send(KvCacheEventData::Cleared);
    }
}

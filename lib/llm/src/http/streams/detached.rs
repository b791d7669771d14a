//! One detached generation: its replay buffer, the signal readers wait on, its count of
//! subscribers, its cancellation, and the task body that drives its producer.

use std::pin::pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::buffer::{Outcome, ReplayBuffer};
use super::event::EventBody;

/// The state a detached generation shares with its readers and its registry.
#[derive(Debug)]
pub(crate) struct Detached {
    pub(crate) request_id: String,
    pub(crate) buffer: Mutex<ReplayBuffer>,
    /// Bumped after every change of the buffer (an event, the end).
    pub(crate) changed: watch::Sender<()>,
    /// Subscribers reading now.
    pub(crate) subscribers: watch::Sender<usize>,
    /// Stops the producer (explicit cancel, registry shutdown) or ends the retention.
    pub(crate) cancel: CancellationToken,
}

impl Detached {
    pub(crate) fn new(request_id: String, buffer_bytes: usize, cancel: CancellationToken) -> Self {
        let buffer = Mutex::new(ReplayBuffer::new(request_id.clone(), buffer_bytes));
        Detached {
            request_id,
            buffer,
            changed: watch::Sender::new(()),
            subscribers: watch::Sender::new(0),
            cancel,
        }
    }

    fn push(&self, body: EventBody) {
        self.buffer.lock().push(body);
        self.changed.send_replace(());
    }

    fn finish(&self, outcome: Outcome) {
        self.buffer.lock().finish(outcome);
        self.changed.send_replace(());
    }
}

/// Run `events` into `detached`'s buffer until it ends, is cancelled, or has had no
/// subscriber for `grace`; dropping the producer then stops its engine. A completed
/// stream is kept for `retention` (or until cancelled) before this returns.
pub(crate) async fn drive<S>(detached: &Detached, events: S, grace: Duration, retention: Duration) -> Outcome
where
    S: Stream<Item = EventBody> + Send,
{
    let outcome = {
        let mut events = pin!(events);
        let mut subscribers = detached.subscribers.subscribe();
        let mut idle_since: Option<Instant> = None;
        loop {
            let idle = *subscribers.borrow_and_update() == 0;
            idle_since = if idle { idle_since.or_else(|| Some(Instant::now())) } else { None };
            let grace_over = async {
                match idle_since {
                    Some(since) => tokio::time::sleep_until(since + grace).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = detached.cancel.cancelled() => break Outcome::Cancelled,
                _ = subscribers.changed() => {}
                item = events.next() => match item {
                    Some(body) => detached.push(body),
                    None => break Outcome::Completed,
                },
                () = grace_over => {
                    tracing::info!(request = %detached.request_id, grace_s = grace.as_secs_f64(), "no subscriber within the grace period; cancelling the stream");
                    break Outcome::Cancelled;
                }
            }
        }
    };
    detached.finish(outcome);
    if outcome == Outcome::Completed {
        tokio::select! {
            () = tokio::time::sleep(retention) => {}
            _ = detached.cancel.cancelled() => {}
        }
    }
    outcome
}

//! The sender of a bounded channel to a publisher task that never waits: a message that
//! does not fit is dropped, counted, and warned about at the 1st, 2nd, 4th, 8th … drop,
//! so an engine's or a router's hot path never blocks on the network. It is how KV events
//! reach their publisher task ([`super::publisher::KvEventPublisher`], the mocker's
//! event sink, which numbers them first) and how a router replica's sync messages reach
//! theirs.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::mpsc;

/// A non-blocking sender that drops (and counts) what its full channel cannot take.
#[derive(Debug)]
pub(crate) struct LossySender<T> {
    tx: mpsc::Sender<T>,
    dropped: AtomicU64,
    /// Logged, with the count, when messages are dropped.
    warning: &'static str,
}

impl<T> LossySender<T> {
    /// Send into `tx`; `warning` says what is being dropped when it is full.
    pub(crate) fn new(tx: mpsc::Sender<T>, warning: &'static str) -> Self {
        LossySender { tx, dropped: AtomicU64::new(0), warning }
    }

    /// Queue `message`; `false` when it was dropped (the queue full, or its task gone).
    /// Only drops of a full queue are counted and warned about: a task that is gone has
    /// stopped on purpose (shutdown).
    pub(crate) fn send(&self, message: T) -> bool {
        match self.tx.try_send(message) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let dropped = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
                if dropped.is_power_of_two() {
                    tracing::warn!(dropped, "{}", self.warning);
                }
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Messages dropped because the queue was full.
    #[cfg(test)]
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_and_counts_what_a_full_queue_cannot_take() {
        let (tx, mut rx) = mpsc::channel(2);
        let sender = LossySender::new(tx, "behind");
        assert!(sender.send(1) && sender.send(2));
        assert!(!sender.send(3), "full: dropped");
        assert_eq!(sender.dropped(), 1);
        assert_eq!(rx.try_recv().unwrap(), 1);
        assert!(sender.send(4));
        assert_eq!((rx.try_recv().unwrap(), rx.try_recv().unwrap()), (2, 4));
        drop(rx);
        assert!(!sender.send(5), "its task is gone");
        assert_eq!(sender.dropped(), 1, "a closed queue is not counted as falling behind");
    }
}

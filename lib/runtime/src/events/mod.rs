//! The event plane: publish/subscribe by subject. KV events and load metrics travel here.
//!
//! Subjects are `.`-separated tokens; a subscription may use `*` (one token) and `>`
//! (the rest), as in NATS. A subscription receives every event published after
//! `subscribe` returned, on both backends (docs/wire-protocol.md, "The embedded event
//! plane"); beyond that delivery is at most once: a subscriber that falls too far behind,
//! or whose connection breaks, misses events (and the drop is logged).

mod hub;
mod nats;
mod tcp;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::Stream;
use tokio::sync::mpsc;

use crate::error::Result;
pub(crate) use hub::EventHub;

/// Events buffered per subscription before new ones are dropped.
pub(crate) const SUBSCRIPTION_BUFFER: usize = 4096;

/// One received event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The subject it was published on.
    pub subject: String,
    /// The payload (JSON for events published from Python).
    pub payload: Bytes,
}

/// A stream of events matching one subject pattern. Dropping it unsubscribes.
pub struct Subscription {
    rx: mpsc::Receiver<Event>,
    _guard: Box<dyn Send + Sync>,
}

impl Subscription {
    pub(crate) fn new(rx: mpsc::Receiver<Event>, guard: impl Send + Sync + 'static) -> Self {
        Subscription { rx, _guard: Box::new(guard) }
    }

    /// The next event, or `None` when the plane shut down.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// Poll for the next event.
    pub fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

impl Stream for Subscription {
    type Item = Event;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.rx.poll_recv(cx)
    }
}

/// Publishes and subscribes on the configured backend.
#[derive(Clone)]
pub enum EventPlane {
    /// Embedded: publisher sockets found through discovery.
    Tcp(Arc<tcp::TcpEventPlane>),
    /// NATS core pub/sub.
    Nats(async_nats::Client),
}

impl EventPlane {
    pub(crate) fn tcp(
        transport: Arc<crate::transport::Transport>,
        discovery: Arc<dyn crate::discovery::Discovery>,
    ) -> Self {
        EventPlane::Tcp(Arc::new(tcp::TcpEventPlane::new(transport, discovery)))
    }

    /// Publish `payload` on `subject`.
    pub async fn publish(&self, subject: &str, payload: Bytes) -> Result<()> {
        match self {
            EventPlane::Tcp(p) => p.publish(subject, payload).await,
            EventPlane::Nats(c) => nats::publish(c, subject, payload).await,
        }
    }

    /// Subscribe to `subject` (wildcards allowed).
    pub async fn subscribe(&self, subject: &str) -> Result<Subscription> {
        match self {
            EventPlane::Tcp(p) => p.subscribe(subject).await,
            EventPlane::Nats(c) => nats::subscribe(c, subject).await,
        }
    }
}

/// Whether `subject` matches `pattern` (`*` = one token, `>` = one or more trailing tokens).
pub fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut p = pattern.split('.');
    let mut s = subject.split('.');
    loop {
        match (p.next(), s.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::subject_matches;

    #[test]
    fn wildcards() {
        assert!(subject_matches("a.b.c", "a.b.c"));
        assert!(!subject_matches("a.b", "a.b.c"));
        assert!(!subject_matches("a.b.c", "a.b"));
        assert!(subject_matches("a.*.c", "a.x.c"));
        assert!(subject_matches("a.>", "a.x.c"));
        assert!(!subject_matches("a.>", "a"));
        assert!(!subject_matches("a.b.kv_events", "a.b.kv_events_v2"));
    }
}

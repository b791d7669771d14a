//! The per-request context a handler sees: its id and whether the caller stopped or
//! abandoned the stream.
//!
//! States only move forward: Live → Stopped → Killed. *Stopped* asks the handler to
//! finish early (it may still send final items); *Killed* means nobody reads the
//! stream any more and the handler should drop everything now.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

/// Where a request's stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum StreamState {
    /// Generating normally.
    Live = 0,
    /// The caller asked to stop generating.
    Stopped = 1,
    /// The caller is gone or abandoned the stream.
    Killed = 2,
}

type Listener = Box<dyn Fn(StreamState) + Send + Sync>;

struct Inner {
    id: String,
    state: AtomicU8,
    changes: watch::Sender<StreamState>,
    listeners: Mutex<Vec<Listener>>,
}

/// A request's identity and cancellation state; cheap to clone.
#[derive(Clone)]
pub struct RequestContext {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for RequestContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestContext").field("id", &self.inner.id).field("state", &self.state()).finish()
    }
}

impl RequestContext {
    /// A live context with the given request id.
    pub fn new(id: impl Into<String>) -> Self {
        RequestContext {
            inner: Arc::new(Inner {
                id: id.into(),
                state: AtomicU8::new(StreamState::Live as u8),
                changes: watch::channel(StreamState::Live).0,
                listeners: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The request id (propagated from the caller).
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The current state.
    pub fn state(&self) -> StreamState {
        match self.inner.state.load(Ordering::Acquire) {
            0 => StreamState::Live,
            1 => StreamState::Stopped,
            _ => StreamState::Killed,
        }
    }

    /// True once stopped or killed.
    pub fn is_stopped(&self) -> bool {
        self.state() >= StreamState::Stopped
    }

    /// True once killed.
    pub fn is_killed(&self) -> bool {
        self.state() == StreamState::Killed
    }

    /// Ask the handler to stop generating.
    pub fn stop_generating(&self) {
        self.advance(StreamState::Stopped);
    }

    /// Abandon the stream.
    pub fn kill(&self) {
        self.advance(StreamState::Killed);
    }

    fn advance(&self, to: StreamState) {
        let prev = self.inner.state.fetch_max(to as u8, Ordering::AcqRel);
        if prev >= to as u8 {
            return;
        }
        self.inner.changes.send_replace(to);
        for listener in self.inner.listeners.lock().iter() {
            listener(to);
        }
    }

    /// Call `f` on every later state change (immediately if already past Live).
    /// Used by the Python bindings to wake asyncio without a task per request.
    pub fn on_change(&self, f: impl Fn(StreamState) + Send + Sync + 'static) {
        let mut listeners = self.inner.listeners.lock();
        let now = self.state();
        if now != StreamState::Live {
            f(now);
        }
        listeners.push(Box::new(f));
    }

    /// Resolves once the stream is stopped or killed.
    pub async fn stopped(&self) {
        let mut rx = self.inner.changes.subscribe();
        let _ = rx.wait_for(|s| *s >= StreamState::Stopped).await;
    }

    /// Resolves once the stream is killed.
    pub async fn killed(&self) {
        let mut rx = self.inner.changes.subscribe();
        let _ = rx.wait_for(|s| *s == StreamState::Killed).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[tokio::test]
    async fn states_only_move_forward_and_wake_waiters() {
        let ctx = RequestContext::new("r1");
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        ctx.on_change(move |_| {
            c.fetch_add(1, Ordering::SeqCst);
        });
        let waiter = tokio::spawn({
            let ctx = ctx.clone();
            async move { ctx.stopped().await }
        });
        ctx.stop_generating();
        waiter.await.unwrap();
        assert!(ctx.is_stopped() && !ctx.is_killed());
        ctx.kill();
        ctx.stop_generating();
        assert_eq!(ctx.state(), StreamState::Killed);
        ctx.killed().await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}

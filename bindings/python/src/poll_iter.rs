//! Async iterators over Rust streams without a task per item: `__anext__` polls the
//! stream directly; when nothing is buffered it parks an asyncio future that the
//! stream's waker resolves through the loop bridge.

use std::sync::{Arc, Weak};
use std::task::{Context, Poll, Wake, Waker};

use parking_lot::Mutex;
use pyo3::exceptions::PyStopAsyncIteration;
use pyo3::prelude::*;

use crate::bridge::{ready, resolve, LoopBridge};

/// A Rust stream a Python async iterator reads.
pub trait Source: Send + 'static {
    /// What the stream yields.
    type Item: Send;
    /// Poll the underlying stream.
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Self::Item>>;
    /// Convert an item: `Ok(None)` skips it, `Err` is raised to the reader.
    fn convert(&self, py: Python<'_>, item: Self::Item) -> PyResult<Option<Py<PyAny>>>;
}

/// Shared state of one Python async iterator.
pub struct PollIter<S: Source> {
    source: Mutex<S>,
    waiter: Mutex<Option<Py<PyAny>>>,
    waker: Waker,
    bridge: Arc<LoopBridge>,
}

struct IterWaker<S: Source> {
    target: Weak<PollIter<S>>,
}

impl<S: Source> Wake for IterWaker<S> {
    fn wake(self: Arc<Self>) {
        if let Some(it) = self.target.upgrade() {
            let bridge = it.bridge.clone();
            bridge.push(move |py| it.on_wake(py));
        }
    }
}

impl<S: Source> PollIter<S> {
    /// Wrap `source`.
    pub fn new(source: S, bridge: Arc<LoopBridge>) -> Arc<Self> {
        Arc::new_cyclic(|weak| PollIter {
            source: Mutex::new(source),
            waiter: Mutex::new(None),
            waker: Waker::from(Arc::new(IterWaker { target: weak.clone() })),
            bridge,
        })
    }

    /// Run `f` on the source (stop, kill, …).
    pub fn with_source<R>(&self, f: impl FnOnce(&mut S) -> R) -> R {
        f(&mut self.source.lock())
    }

    /// Poll until an item to hand out, the end, or pending.
    fn poll_next(&self, py: Python<'_>) -> Poll<PyResult<Py<PyAny>>> {
        // Polling may start Rust work (a resend to another instance spawns tasks).
        let _runtime = crate::bridge::tokio().enter();
        let mut source = self.source.lock();
        let mut cx = Context::from_waker(&self.waker);
        loop {
            match source.poll(&mut cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Err(PyStopAsyncIteration::new_err(()))),
                Poll::Ready(Some(item)) => match source.convert(py, item) {
                    Ok(Some(obj)) => return Poll::Ready(Ok(obj)),
                    Ok(None) => continue,
                    Err(e) => return Poll::Ready(Err(e)),
                },
            }
        }
    }

    /// The awaitable `__anext__` returns.
    pub fn anext(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.poll_next(py) {
            Poll::Ready(result) => ready(py, result),
            Poll::Pending => {
                let fut = self.bridge.create_future(py)?;
                *self.waiter.lock() = Some(fut.clone_ref(py));
                Ok(fut)
            }
        }
    }

    fn on_wake(&self, py: Python<'_>) {
        let Some(fut) = self.waiter.lock().take() else { return };
        match self.poll_next(py) {
            Poll::Ready(result) => resolve(py, &fut, result),
            Poll::Pending => *self.waiter.lock() = Some(fut),
        }
    }
}

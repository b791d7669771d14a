//! Serving a Python handler: requests are handed to the asyncio loop in batches, a
//! Python dispatcher runs each in a task, and items go back through a [`Sink`].

use std::sync::{Arc, Weak};

use bytes::Bytes;
use dynamo_runtime::transport::responder::SendError;
use dynamo_runtime::{ErrorKind, IncomingRequest, RequestContext, RequestHandler, Responder, StreamState};
use parking_lot::Mutex;
use pyo3::prelude::*;

use crate::bridge::{ready, resolve, LoopBridge};
use crate::convert::{from_json, to_json};

/// A Python dispatcher `dispatch(request, context, sink)` behind the runtime's handler trait.
pub struct PyHandler {
    pub bridge: Arc<LoopBridge>,
    pub dispatch: Arc<Py<PyAny>>,
}

impl RequestHandler for PyHandler {
    fn handle(&self, request: IncomingRequest, responder: Responder) {
        let dispatch = self.dispatch.clone();
        let bridge = self.bridge.clone();
        self.bridge.push(move |py| {
            let context = PyRequestContext::new(request.context.clone(), bridge.clone());
            let sink = Sink { responder: Mutex::new(Some(responder)), pending: Mutex::new(None), bridge };
            let payload = match from_json(py, &request.body) {
                Ok(p) => p,
                Err(e) => return sink.fail(ErrorKind::Serialization, &format!("invalid request: {e}")),
            };
            let called = Py::new(py, context).and_then(|ctx| Ok((ctx, Py::new(py, sink)?))).and_then(|(ctx, sink)| dispatch.call1(py, (payload, ctx, sink)));
            if let Err(e) = called {
                e.write_unraisable(py, None);
            }
        });
    }
}

/// Where a Python handler's items go.
#[pyclass(module = "dynamo._core", frozen)]
pub struct Sink {
    responder: Mutex<Option<Responder>>,
    pending: Mutex<Option<(Bytes, Bytes)>>,
    bridge: Arc<LoopBridge>,
}

impl Sink {
    fn fail(&self, kind: ErrorKind, message: &str) {
        if let Some(r) = self.responder.lock().take() {
            r.error(kind, message);
        }
    }
}

#[pymethods]
impl Sink {
    /// Queue an item. False: the queue is full (await `flush()`) or the stream is closed.
    fn send(&self, item: &Bound<'_, PyAny>) -> PyResult<bool> {
        let body = to_json(item)?;
        let guard = self.responder.lock();
        let Some(r) = guard.as_ref() else { return Ok(false) };
        Ok(match r.try_send(Bytes::new(), body) {
            Ok(()) => true,
            Err(SendError::Full(h, b)) => {
                *self.pending.lock() = Some((h, b));
                false
            }
            Err(SendError::Closed) => false,
        })
    }

    /// Whether the caller is gone (stop sending).
    #[getter]
    fn closed(&self) -> bool {
        match self.responder.lock().as_ref() {
            Some(r) => r.context().is_killed(),
            None => true,
        }
    }

    /// Wait for queue space and send the item `send` could not queue.
    fn flush(slf: Py<Self>, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let this = slf.get();
        let pending = this.pending.lock().take();
        let responder = this.responder.lock().take();
        let (Some((h, b)), Some(r)) = (pending, responder) else {
            return ready(py, Ok(py.None()));
        };
        let bridge = this.bridge.clone();
        bridge.awaitable(
            py,
            async move {
                let _ = r.send(h, b).await;
                Ok(r)
            },
            move |py, r| {
                *slf.get().responder.lock() = Some(r);
                Ok(py.None())
            },
        )
    }

    /// End the stream normally.
    fn finish(&self) {
        if let Some(r) = self.responder.lock().take() {
            r.finish();
        }
    }

    /// End the stream with the handler's error message.
    fn error(&self, message: &str) {
        self.fail(ErrorKind::Handler, message);
    }

    /// End the stream as unavailable: this worker can no longer serve it (the caller
    /// may send it elsewhere, as when the worker dies).
    fn unavailable(&self, message: &str) {
        self.fail(ErrorKind::Unavailable, message);
    }
}

struct ContextShared {
    context: RequestContext,
    task: Mutex<Option<Py<PyAny>>>,
    stop_waiters: Mutex<Vec<Py<PyAny>>>,
    kill_waiters: Mutex<Vec<Py<PyAny>>>,
}

impl ContextShared {
    /// On the loop thread after a state change: cancel the task when killed, wake waiters.
    fn on_change(&self, py: Python<'_>, state: StreamState) {
        let woken: Vec<Py<PyAny>> = if state == StreamState::Killed {
            let mut all = std::mem::take(&mut *self.stop_waiters.lock());
            all.extend(std::mem::take(&mut *self.kill_waiters.lock()));
            all
        } else {
            std::mem::take(&mut *self.stop_waiters.lock())
        };
        for fut in woken {
            resolve(py, &fut, Ok(py.None()));
        }
        if state == StreamState::Killed {
            if let Some(task) = self.task.lock().take() {
                let _ = task.call_method0(py, "cancel");
            }
        }
    }
}

/// The handler's view of its request: id, stop/kill state and awaitables.
#[pyclass(name = "RequestContext", module = "dynamo._core", frozen)]
pub struct PyRequestContext {
    shared: Arc<ContextShared>,
    bridge: Arc<LoopBridge>,
}

impl PyRequestContext {
    /// The runtime's context of the request (to pass on to calls made for it).
    pub(crate) fn context(&self) -> RequestContext {
        self.shared.context.clone()
    }

    pub(crate) fn new(context: RequestContext, bridge: Arc<LoopBridge>) -> Self {
        let shared = Arc::new(ContextShared {
            context: context.clone(),
            task: Mutex::new(None),
            stop_waiters: Mutex::new(Vec::new()),
            kill_waiters: Mutex::new(Vec::new()),
        });
        // Weak: the context owns its listeners, so a strong ref would be a cycle.
        let weak: Weak<ContextShared> = Arc::downgrade(&shared);
        let b = bridge.clone();
        context.on_change(move |state| {
            if let Some(shared) = weak.upgrade() {
                b.push(move |py| shared.on_change(py, state));
            }
        });
        PyRequestContext { shared, bridge }
    }

    fn wait(&self, py: Python<'_>, done: bool, waiters: &Mutex<Vec<Py<PyAny>>>) -> PyResult<Py<PyAny>> {
        if done {
            return ready(py, Ok(py.None()));
        }
        let fut = self.bridge.create_future(py)?;
        waiters.lock().push(fut.clone_ref(py));
        Ok(fut)
    }
}

#[pymethods]
impl PyRequestContext {
    /// The request id (the caller's, propagated).
    fn id(&self) -> String {
        self.shared.context.id().to_string()
    }

    /// True once the caller asked to stop (or killed the stream).
    fn is_stopped(&self) -> bool {
        self.shared.context.is_stopped()
    }

    /// True once the caller is gone.
    fn is_killed(&self) -> bool {
        self.shared.context.is_killed()
    }

    /// Mark the stream stopped from the handler side.
    fn stop_generating(&self) {
        self.shared.context.stop_generating();
    }

    /// Resolves when the stream is stopped or killed.
    fn stopped(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.wait(py, self.shared.context.is_stopped(), &self.shared.stop_waiters)
    }

    /// Same as `stopped()` (name used by other Dynamo versions).
    fn async_killed_or_stopped(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.stopped(py)
    }

    /// Resolves when the stream is killed.
    fn killed(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.wait(py, self.shared.context.is_killed(), &self.shared.kill_waiters)
    }

    /// Internal: the task running the handler, cancelled if the stream is killed.
    fn _attach_task(&self, py: Python<'_>, task: Py<PyAny>) -> PyResult<()> {
        if self.shared.context.is_killed() {
            task.call_method0(py, "cancel")?;
        } else {
            *self.shared.task.lock() = Some(task);
        }
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("RequestContext(id={:?}, state={:?})", self.shared.context.id(), self.shared.context.state())
    }
}

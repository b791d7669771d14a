//! The tokio ↔ asyncio bridge.
//!
//! Tokio threads never take the GIL to hand a result to Python: they queue a job and,
//! if the queue was empty, write one byte to a socket the asyncio loop watches
//! (`loop.add_reader`). The loop thread then runs every queued job at once, under the
//! GIL it already holds. Results that are ready at once (a buffered item, a send that
//! found queue space) skip the loop entirely through [`Ready`]. The other way round,
//! [`LoopBridge::run_coroutine`] lets Rust await a Python coroutine run on the loop.

use std::future::Future;
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyStopIteration};
use pyo3::intern;
use pyo3::prelude::*;

type Job = Box<dyn FnOnce(Python<'_>) + Send>;

/// The process-wide tokio runtime.
pub fn tokio() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        let threads = std::env::var("DYN_RUNTIME_NUM_WORKER_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|n| *n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2).min(4));
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("dynamo-tokio")
            .enable_all()
            .build()
            .expect("cannot start the tokio runtime")
    })
}

/// Runs jobs on one asyncio loop's thread.
pub struct LoopBridge {
    jobs: Mutex<Vec<Job>>,
    armed: AtomicBool,
    wake_tx: UnixStream,
    wake_rx: UnixStream,
    pub event_loop: Py<PyAny>,
}

impl LoopBridge {
    /// Create a bridge and register its reader on `event_loop`.
    pub fn attach(py: Python<'_>, event_loop: Py<PyAny>) -> PyResult<Arc<LoopBridge>> {
        let (wake_tx, wake_rx) = UnixStream::pair().map_err(|e| PyRuntimeError::new_err(format!("socketpair: {e}")))?;
        wake_tx.set_nonblocking(true).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        wake_rx.set_nonblocking(true).map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
        let bridge = Arc::new(LoopBridge { jobs: Mutex::new(Vec::new()), armed: AtomicBool::new(false), wake_tx, wake_rx, event_loop });
        let drain = Py::new(py, Drain { bridge: bridge.clone() })?;
        bridge.event_loop.call_method1(py, "add_reader", (bridge.wake_rx.as_raw_fd(), drain))?;
        Ok(bridge)
    }

    /// Queue `job` to run on the loop thread. Never takes the GIL.
    pub fn push(&self, job: impl FnOnce(Python<'_>) + Send + 'static) {
        self.jobs.lock().push(Box::new(job));
        if !self.armed.swap(true, Ordering::AcqRel) {
            let _ = (&self.wake_tx).write(&[1]);
        }
    }

    fn drain(&self, py: Python<'_>) {
        let mut buf = [0u8; 256];
        while let Ok(n) = (&self.wake_rx).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        // Disarm before taking the jobs: a push racing with us either lands in this
        // batch or writes a new wake byte.
        self.armed.store(false, Ordering::Release);
        let jobs = std::mem::take(&mut *self.jobs.lock());
        for job in jobs {
            job(py);
        }
    }

    /// Create an asyncio future on this loop.
    pub fn create_future(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.event_loop.call_method0(py, intern!(py, "create_future"))
    }

    /// Turn a Rust future into a Python awaitable. The future is polled once right
    /// away: if it is ready, no tokio task or loop wake-up is needed.
    pub fn awaitable<T, F, C>(self: &Arc<Self>, py: Python<'_>, fut: F, convert: C) -> PyResult<Py<PyAny>>
    where
        T: Send + 'static,
        F: Future<Output = PyResult<T>> + Send + 'static,
        C: FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let mut fut = Box::pin(fut);
        let polled = {
            let _guard = tokio().enter();
            let waker = futures::task::noop_waker();
            fut.as_mut().poll(&mut Context::from_waker(&waker))
        };
        if let Poll::Ready(result) = polled {
            return ready(py, result.and_then(|v| convert(py, v)));
        }
        let py_future = self.create_future(py)?;
        let target = py_future.clone_ref(py);
        let bridge = self.clone();
        let task = tokio().spawn(async move {
            let result = fut.await;
            bridge.push(move |py| resolve(py, &target, result.and_then(|v| convert(py, v))));
        });
        // Cancelling the asyncio future aborts the Rust work.
        let canceller = Py::new(py, AbortOnCancel { handle: task.abort_handle() })?;
        py_future.call_method1(py, "add_done_callback", (canceller,))?;
        Ok(py_future)
    }
}

/// A Python task started for Rust by [`LoopBridge::run_coroutine`].
struct CoroutineCall {
    /// The asyncio task, until it is done (dropped on the loop thread).
    task: Option<Py<PyAny>>,
    /// The Rust side stopped waiting: cancel the task when it starts.
    abandoned: bool,
    /// Where the outcome goes: the result as JSON, or the exception as text.
    reply: Option<tokio::sync::oneshot::Sender<Result<Bytes, String>>>,
}

impl CoroutineCall {
    fn answer(&mut self, outcome: Result<Bytes, String>) {
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(outcome);
        }
    }
}

impl LoopBridge {
    /// Run a Python coroutine on this loop and await its result, as JSON, from Rust:
    /// `start` runs on the loop thread and returns the awaitable (e.g. calls an async
    /// function). An exception comes back as its text. Dropping the returned future
    /// cancels the Python task.
    pub fn run_coroutine<F>(self: &Arc<Self>, start: F) -> impl Future<Output = Result<Bytes, String>> + Send + 'static
    where
        F: FnOnce(Python<'_>) -> PyResult<Py<PyAny>> + Send + 'static,
    {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let call = Arc::new(Mutex::new(CoroutineCall { task: None, abandoned: false, reply: Some(reply) }));
        let on_loop = call.clone();
        self.push(move |py| {
            let started = (|| -> PyResult<Py<PyAny>> {
                let awaitable = start(py)?;
                let task = py.import("asyncio")?.call_method1("ensure_future", (awaitable,))?;
                task.call_method1("add_done_callback", (Py::new(py, CoroutineDone { call: on_loop.clone() })?,))?;
                Ok(task.unbind())
            })();
            let mut state = on_loop.lock();
            match started {
                Ok(task) if state.abandoned => {
                    let _ = task.call_method0(py, "cancel");
                }
                Ok(task) => {
                    if state.reply.is_some() {
                        state.task = Some(task);
                    }
                }
                Err(e) => state.answer(Err(e.to_string())),
            }
        });
        let guard = CancelCoroutine { bridge: self.clone(), call };
        async move {
            let outcome = answer.await.unwrap_or_else(|_| Err("the asyncio loop closed before answering".to_string()));
            drop(guard);
            outcome
        }
    }
}

/// The done-callback of a [`LoopBridge::run_coroutine`] task.
#[pyclass(module = "dynamo._core")]
struct CoroutineDone {
    call: Arc<Mutex<CoroutineCall>>,
}

#[pymethods]
impl CoroutineDone {
    fn __call__(&self, task: &Bound<'_, PyAny>) {
        let outcome = if task.call_method0("cancelled").and_then(|c| c.is_truthy()).unwrap_or(true) {
            Err("the Python task was cancelled".to_string())
        } else {
            match task.call_method0("result") {
                Ok(value) => crate::convert::to_json(&value).map_err(|e| format!("the result is not JSON: {e}")),
                Err(e) => Err(e.to_string()),
            }
        };
        let mut state = self.call.lock();
        state.task = None;
        state.answer(outcome);
    }
}

/// Cancels the Python task of a [`LoopBridge::run_coroutine`] call nobody awaits any more.
struct CancelCoroutine {
    bridge: Arc<LoopBridge>,
    call: Arc<Mutex<CoroutineCall>>,
}

impl Drop for CancelCoroutine {
    fn drop(&mut self) {
        let task = {
            let mut state = self.call.lock();
            state.abandoned = true;
            state.reply = None;
            state.task.take()
        };
        if let Some(task) = task {
            self.bridge.push(move |py| {
                let _ = task.call_method0(py, "cancel");
            });
        }
    }
}

/// Wrap an awaitable in a coroutine (for calls users hand to `asyncio.create_task`).
pub fn coroutine(py: Python<'_>, awaitable: PyResult<Py<PyAny>>) -> PyResult<Py<PyAny>> {
    let helper = py.import("dynamo.runtime._serving")?.getattr("as_coroutine")?;
    Ok(helper.call1((awaitable?,))?.unbind())
}

/// Set the result or exception of an asyncio future unless it is already done (cancelled).
pub fn resolve(py: Python<'_>, future: &Py<PyAny>, result: PyResult<Py<PyAny>>) {
    let fut = future.bind(py);
    if fut.call_method0(intern!(py, "done")).and_then(|d| d.is_truthy()).unwrap_or(true) {
        return;
    }
    let outcome = match result {
        Ok(v) => fut.call_method1(intern!(py, "set_result"), (v,)),
        Err(e) => fut.call_method1(intern!(py, "set_exception"), (e.into_value(py),)),
    };
    if let Err(e) = outcome {
        e.write_unraisable(py, Some(fut));
    }
}

/// An awaitable that is already complete: awaiting it returns (or raises) at once.
pub fn ready(py: Python<'_>, result: PyResult<Py<PyAny>>) -> PyResult<Py<PyAny>> {
    Ok(Py::new(py, Ready { result: Mutex::new(Some(result)) })?.into_any())
}

#[pyclass(module = "dynamo._core")]
struct Drain {
    bridge: Arc<LoopBridge>,
}

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        self.bridge.drain(py);
    }
}

#[pyclass(module = "dynamo._core")]
struct AbortOnCancel {
    handle: tokio::task::AbortHandle,
}

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, future: &Bound<'_, PyAny>) -> PyResult<()> {
        if future.call_method0("cancelled")?.is_truthy()? {
            self.handle.abort();
        }
        Ok(())
    }
}

/// A completed awaitable (see [`ready`]).
#[pyclass(module = "dynamo._core")]
pub struct Ready {
    result: Mutex<Option<PyResult<Py<PyAny>>>>,
}

#[pymethods]
impl Ready {
    fn __await__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __iter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.result.lock().take() {
            Some(Ok(v)) => Err(PyStopIteration::new_err((v,))),
            Some(Err(e)) => Err(e),
            None => Err(PyStopIteration::new_err((py.None(),))),
        }
    }

    fn send(&self, py: Python<'_>, _value: Py<PyAny>) -> PyResult<Py<PyAny>> {
        self.__next__(py)
    }

    fn close(&self) {}
}

/// Poll a future to completion from a synchronous binding call, without the GIL.
pub fn block_on<F: Future + Send>(py: Python<'_>, fut: F) -> F::Output
where
    F::Output: Send,
{
    py.detach(|| tokio().block_on(fut))
}

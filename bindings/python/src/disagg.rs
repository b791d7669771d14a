//! Disaggregated serving for Python engines (docs/disagg.md): the decode side's
//! `RemotePrefill` (the core's rule, queue, bound and counters, called from a Python
//! handler) and `serve_prefill_worker` driving an async Python prefill function.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dynamo_llm::disagg::{
    default_prefill_endpoint, serve_prefill_worker as serve_prefill, DisaggConfig, DisaggMetrics, DisaggRole,
    KvPrefill, KvTransferDescriptor, PrefillQueue, PrefillQueueKind, PrefillWorker, RemotePrefill,
    DEFAULT_MAX_CONCURRENT_PREFILLS, DEFAULT_MAX_LOCAL_PREFILL_LENGTH, DEFAULT_MAX_PREFILL_QUEUE_SIZE,
};
use dynamo_llm::engine::{EngineError, RequestContext};
use dynamo_llm::protocols::common::PreprocessedRequest;
use dynamo_runtime::EndpointId;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::bridge::{coroutine, LoopBridge};
use crate::convert::from_json;
use crate::errors::to_py;
use crate::runtime::PyEndpoint;
use crate::serving::PyRequestContext;

// The signatures spell the core's defaults as literals, so that Python (and the stubs)
// see them; a changed default must change them too.
const _: () = assert!(
    DEFAULT_MAX_LOCAL_PREFILL_LENGTH == 1000 && DEFAULT_MAX_PREFILL_QUEUE_SIZE == 2 && DEFAULT_MAX_CONCURRENT_PREFILLS == 2
);

/// A decode worker's side of disaggregated serving.
#[pyclass(name = "RemotePrefill", module = "dynamo._core", frozen)]
pub struct PyRemotePrefill {
    inner: Arc<RemotePrefill>,
    bridge: Arc<LoopBridge>,
    transport: &'static str,
}

#[pymethods]
impl PyRemotePrefill {
    /// Connect the decode worker serving `endpoint` to the prefill queue.
    #[staticmethod]
    #[pyo3(signature = (
        endpoint,
        prefill_endpoint=None,
        max_local_prefill_length=1000,
        max_prefill_queue_size=2,
        remote_prefill_timeout=30.0,
    ))]
    fn connect(
        py: Python<'_>,
        endpoint: &PyEndpoint,
        prefill_endpoint: Option<String>,
        max_local_prefill_length: usize,
        max_prefill_queue_size: usize,
        remote_prefill_timeout: f64,
    ) -> PyResult<Py<PyAny>> {
        if !(remote_prefill_timeout.is_finite() && remote_prefill_timeout > 0.0) {
            return Err(PyValueError::new_err(format!(
                "remote_prefill_timeout must be a positive number of seconds, got {remote_prefill_timeout}"
            )));
        }
        let ep = endpoint.inner.clone();
        let prefill_id = match &prefill_endpoint {
            Some(path) => EndpointId::parse(path),
            None => default_prefill_endpoint(&ep.id().namespace),
        }
        .map_err(to_py)?;
        let config = DisaggConfig {
            role: DisaggRole::Decode,
            max_local_prefill_length,
            max_prefill_queue_size,
            remote_prefill_timeout: Duration::from_secs_f64(remote_prefill_timeout),
            ..Default::default()
        };
        let bridge = endpoint.bridge.clone();
        let connected = endpoint.bridge.awaitable(
            py,
            async move {
                let runtime = ep.planes().clone();
                let queue = PrefillQueue::connect(&runtime, &prefill_id).await.map_err(to_py)?;
                let metrics = DisaggMetrics::register(&runtime).map_err(to_py)?;
                Ok(RemotePrefill::new(queue, config, metrics))
            },
            move |py, remote| {
                let transport = match remote.queue().kind() {
                    PrefillQueueKind::RequestPlane => "request_plane",
                    PrefillQueueKind::JetStream => "jetstream",
                };
                Ok(Py::new(py, PyRemotePrefill { inner: Arc::new(remote), bridge, transport })?.into_any())
            },
        );
        coroutine(py, connected)
    }

    /// Where the prefill jobs go: `"request_plane"` or `"jetstream"`.
    #[getter]
    fn transport(&self) -> &'static str {
        self.transport
    }

    /// Decide where the prompt is prefilled and, if remotely, wait for the prefill
    /// worker's descriptor (a dict, with the engine's `engine_params`); `None`: prefill
    /// locally (by the rule, or after the remote prefill failed or timed out).
    #[pyo3(signature = (token_ids, context, cached_tokens=0))]
    fn prefill(
        &self,
        py: Python<'_>,
        token_ids: Vec<u32>,
        context: &PyRequestContext,
        cached_tokens: usize,
    ) -> PyResult<Py<PyAny>> {
        let remote = self.inner.clone();
        let ctx = context.context();
        let received = self.bridge.awaitable(
            py,
            async move {
                let cached = async { cached_tokens };
                let receive = |descriptor: KvTransferDescriptor| async move { Ok(descriptor) };
                let descriptor = remote.prefill(&token_ids, &ctx, cached, receive).await;
                descriptor
                    .map(|d| serde_json::to_vec(&d))
                    .transpose()
                    .map_err(|e| PyValueError::new_err(format!("cannot serialize the descriptor: {e}")))
            },
            |py, json| match json {
                Some(json) => from_json(py, &json),
                None => Ok(py.None()),
            },
        );
        coroutine(py, received)
    }
}

/// A prefill worker's engine written in Python: `prefill(request, context)` computes
/// the prompt and returns the engine's transfer parameters (JSON-like, or `None`).
struct PyPrefillEngine {
    bridge: Arc<LoopBridge>,
    prefill: Arc<Py<PyAny>>,
    block_size: usize,
}

#[async_trait]
impl KvPrefill for PyPrefillEngine {
    async fn prefill_for_transfer(
        &self,
        request: PreprocessedRequest,
        ctx: RequestContext,
        source_worker: u64,
    ) -> Result<KvTransferDescriptor, EngineError> {
        let body = serde_json::to_vec(&request).map_err(|e| EngineError::Internal(format!("prefill request: {e}")))?;
        let (prefill, bridge, context) = (self.prefill.clone(), self.bridge.clone(), ctx.clone());
        let params = self
            .bridge
            .run_coroutine(move |py| {
                let request = from_json(py, &body)?;
                let context = Py::new(py, PyRequestContext::new(context, bridge))?;
                prefill.call1(py, (request, context))
            })
            .await
            .map_err(|e| EngineError::Internal(format!("the prefill function failed: {e}")))?;
        let params: serde_json::Value = serde_json::from_slice(&params)
            .map_err(|e| EngineError::Internal(format!("the prefill function's result: {e}")))?;
        let params = (!params.is_null()).then_some(params);
        Ok(KvTransferDescriptor::for_prompt(ctx.id(), source_worker, &request.token_ids, self.block_size, params))
    }
}

/// A running prefill worker (see `serve_prefill_worker`).
#[pyclass(name = "PrefillWorker", module = "dynamo._core", frozen)]
pub struct PyPrefillWorker {
    inner: Arc<PrefillWorker>,
    bridge: Arc<LoopBridge>,
}

#[pymethods]
impl PyPrefillWorker {
    /// Stop taking jobs from the JetStream queue (the endpoint serves until the runtime
    /// shuts down).
    fn shutdown(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let worker = self.inner.clone();
        let done = self.bridge.awaitable(py, async move {
            worker.shutdown().await;
            Ok(())
        }, |py, ()| Ok(py.None()));
        coroutine(py, done)
    }
}

/// Serve prefill jobs on `endpoint` with the async function `prefill(request, context)`.
#[pyfunction]
#[pyo3(signature = (endpoint, prefill, block_size, max_concurrent_prefills=2))]
pub fn serve_prefill_worker(
    py: Python<'_>,
    endpoint: &PyEndpoint,
    prefill: Py<PyAny>,
    block_size: usize,
    max_concurrent_prefills: usize,
) -> PyResult<Py<PyAny>> {
    if !prefill.bind(py).is_callable() {
        return Err(PyTypeError::new_err("prefill must be an async function prefill(request, context)"));
    }
    if block_size == 0 || max_concurrent_prefills == 0 {
        return Err(PyValueError::new_err("block_size and max_concurrent_prefills must be at least 1"));
    }
    let engine = Arc::new(PyPrefillEngine { bridge: endpoint.bridge.clone(), prefill: Arc::new(prefill), block_size });
    let config = DisaggConfig { role: DisaggRole::Prefill, max_concurrent_prefills, ..Default::default() };
    let ep = endpoint.inner.clone();
    let bridge = endpoint.bridge.clone();
    let served = endpoint.bridge.awaitable(
        py,
        async move {
            let metrics = DisaggMetrics::register(ep.planes()).map_err(to_py)?;
            serve_prefill(&ep, engine, &config, metrics).await.map_err(to_py)
        },
        move |py, worker| Ok(Py::new(py, PyPrefillWorker { inner: Arc::new(worker), bridge })?.into_any()),
    );
    coroutine(py, served)
}

/// Add this module's classes and functions to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRemotePrefill>()?;
    m.add_class::<PyPrefillWorker>()?;
    m.add_function(wrap_pyfunction!(serve_prefill_worker, m)?)?;
    Ok(())
}

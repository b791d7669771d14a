//! `DistributedRuntime`, `Namespace`, `Component`, `Endpoint` for Python.

use std::sync::Arc;

use bytes::Bytes;
use dynamo_runtime::config::RuntimeConfig;
use dynamo_runtime::events::Subscription;
use dynamo_runtime::{Component, DistributedRuntime, Endpoint, EndpointId, Namespace};
use pyo3::prelude::*;

use crate::bridge::{block_on, coroutine, LoopBridge};
use crate::client::PyClient;
use crate::convert::to_json;
use crate::errors::{to_py, ConfigError};
use crate::events::PySubscription;
use crate::kv::PyKeyValueStore;
use crate::serving::PyHandler;

fn parse<T: std::str::FromStr<Err = String>>(key: &str, value: Option<String>, target: &mut T) -> PyResult<()> {
    if let Some(v) = value {
        *target = v.parse().map_err(|e| ConfigError::new_err(format!("invalid {key}: {e}")))?;
    }
    Ok(())
}

/// The drain bound (`DYN_SHUTDOWN_TIMEOUT`, seconds) of a process whose environment is
/// `env`, as its runtime reads it: the one rule, for a supervisor sizing its SIGKILL.
#[pyfunction]
pub fn drain_bound_s(env: std::collections::HashMap<String, String>) -> PyResult<f64> {
    let config = RuntimeConfig::from_lookup(|k| env.get(k).cloned()).map_err(to_py)?;
    Ok(config.shutdown_timeout.as_secs_f64())
}

/// The process's runtime handle, bound to one asyncio loop.
#[pyclass(name = "DistributedRuntime", module = "dynamo._core", frozen)]
pub struct PyDistributedRuntime {
    inner: DistributedRuntime,
    bridge: Arc<LoopBridge>,
}

#[pymethods]
impl PyDistributedRuntime {
    #[new]
    #[pyo3(signature = (event_loop, is_static=false, *, discovery=None, request_plane=None, event_plane=None))]
    fn new(
        py: Python<'_>,
        event_loop: Py<PyAny>,
        is_static: bool,
        discovery: Option<String>,
        request_plane: Option<String>,
        event_plane: Option<String>,
    ) -> PyResult<Self> {
        // `is_static` is accepted for compatibility: every backend here discovers instances.
        let _ = is_static;
        dynamo_runtime::logging::init();
        let mut config = RuntimeConfig::from_env().map_err(to_py)?;
        parse("discovery backend", discovery, &mut config.discovery)?;
        parse("request plane", request_plane, &mut config.request_plane)?;
        parse("event plane", event_plane, &mut config.event_plane)?;
        let inner = block_on(py, DistributedRuntime::new(config)).map_err(to_py)?;
        let bridge = LoopBridge::attach(py, event_loop)?;
        Ok(PyDistributedRuntime { inner, bridge })
    }

    /// A namespace handle.
    fn namespace(&self, name: String) -> PyResult<PyNamespace> {
        Ok(PyNamespace { inner: self.inner.namespace(name).map_err(to_py)?, bridge: self.bridge.clone() })
    }

    /// The endpoint at `namespace.component.endpoint`.
    fn endpoint(&self, path: &str) -> PyResult<PyEndpoint> {
        let id = EndpointId::parse(path).map_err(to_py)?;
        let ep = self
            .inner
            .namespace(id.namespace)
            .and_then(|n| n.component(id.component))
            .and_then(|c| c.endpoint(id.name))
            .map_err(to_py)?;
        Ok(PyEndpoint { inner: ep, bridge: self.bridge.clone() })
    }

    /// This process's instance id (stable for its life).
    fn instance_id(&self) -> u64 {
        self.inner.instance_id()
    }

    /// The asyncio loop the runtime is bound to.
    fn event_loop(&self, py: Python<'_>) -> Py<PyAny> {
        self.bridge.event_loop.clone_ref(py)
    }

    /// `host:port` of the system server, when enabled.
    fn system_address(&self) -> Option<String> {
        self.inner.system_address().map(|a| a.to_string())
    }

    /// Begin graceful shutdown; the returned awaitable completes when it is done.
    fn shutdown(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rt = self.inner.clone();
        self.bridge.awaitable(
            py,
            async move {
                rt.shutdown().await;
                Ok(())
            },
            |py, ()| Ok(py.None()),
        )
    }

    /// Resolves once shutdown has finished.
    fn closed(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let rt = self.inner.clone();
        let closed = self.bridge.awaitable(
            py,
            async move {
                rt.closed().await;
                Ok(())
            },
            |py, ()| Ok(py.None()),
        );
        coroutine(py, closed)
    }

    /// Whether shutdown has begun.
    fn is_shutting_down(&self) -> bool {
        self.inner.is_shutting_down()
    }

    /// Hold (`False`) or give (`True`) the readiness mark `/ready` reads.
    fn set_ready(&self, ready: bool) {
        self.inner.set_ready(ready);
    }

    /// `None` when ready (what `/ready` answers 200 to), else why not: `"draining"`,
    /// `"not_registered"` or `"engine_not_ready"`.
    fn not_ready(&self) -> Option<&'static str> {
        self.inner.readiness().err().map(|why| why.status())
    }

    /// The discovery backend's key-value store.
    fn kv_store(&self) -> PyKeyValueStore {
        PyKeyValueStore { discovery: self.inner.discovery().clone(), bridge: self.bridge.clone() }
    }

    /// Same as `kv_store()` (the reference API's name; works on every backend).
    fn etcd_client(&self) -> PyKeyValueStore {
        self.kv_store()
    }
}

fn publish(py: Python<'_>, bridge: &Arc<LoopBridge>, subject: String, events: dynamo_runtime::events::EventPlane, obj: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let payload: Bytes = to_json(obj)?;
    bridge.awaitable(py, async move { events.publish(&subject, payload).await.map_err(to_py) }, |py, ()| Ok(py.None()))
}

fn subscribe(py: Python<'_>, bridge: &Arc<LoopBridge>, subject: String, events: dynamo_runtime::events::EventPlane) -> PyResult<Py<PyAny>> {
    let b = bridge.clone();
    bridge.awaitable(
        py,
        async move { events.subscribe(&subject).await.map_err(to_py) },
        move |py, sub: Subscription| Ok(Py::new(py, PySubscription::new(sub, b))?.into_any()),
    )
}

/// A namespace.
#[pyclass(name = "Namespace", module = "dynamo._core", frozen)]
pub struct PyNamespace {
    inner: Namespace,
    bridge: Arc<LoopBridge>,
}

#[pymethods]
impl PyNamespace {
    /// A component of this namespace.
    fn component(&self, name: String) -> PyResult<PyComponent> {
        Ok(PyComponent { inner: self.inner.component(name).map_err(to_py)?, bridge: self.bridge.clone() })
    }

    /// The namespace's name.
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Publish a JSON-able object as event `name` of this namespace.
    fn publish(&self, py: Python<'_>, name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let events = self.inner.planes().events().clone();
        publish(py, &self.bridge, self.inner.event_subject(name), events, obj)
    }

    /// Subscribe to event `name` of this namespace.
    fn subscribe(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let events = self.inner.planes().events().clone();
        subscribe(py, &self.bridge, self.inner.event_subject(name), events)
    }
}

/// A component.
#[pyclass(name = "Component", module = "dynamo._core", frozen)]
pub struct PyComponent {
    pub(crate) inner: Component,
    pub(crate) bridge: Arc<LoopBridge>,
}

#[pymethods]
impl PyComponent {
    /// An endpoint of this component.
    fn endpoint(&self, name: String) -> PyResult<PyEndpoint> {
        Ok(PyEndpoint { inner: self.inner.endpoint(name).map_err(to_py)?, bridge: self.bridge.clone() })
    }

    /// The component's name.
    fn name(&self) -> String {
        self.inner.name().to_string()
    }

    /// Kept for compatibility: endpoints register themselves when served.
    fn create_service(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        crate::bridge::ready(py, Ok(py.None()))
    }

    /// Publish a JSON-able object as event `name` of this component.
    fn publish(&self, py: Python<'_>, name: &str, obj: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let events = self.inner.planes().events().clone();
        publish(py, &self.bridge, self.inner.event_subject(name), events, obj)
    }

    /// Subscribe to event `name` of this component.
    fn subscribe(&self, py: Python<'_>, name: &str) -> PyResult<Py<PyAny>> {
        let events = self.inner.planes().events().clone();
        subscribe(py, &self.bridge, self.inner.event_subject(name), events)
    }
}

/// An endpoint.
#[pyclass(name = "Endpoint", module = "dynamo._core", frozen)]
pub struct PyEndpoint {
    pub(crate) inner: Endpoint,
    pub(crate) bridge: Arc<LoopBridge>,
}

#[pymethods]
impl PyEndpoint {
    /// Serve `handler(request[, context])` (an async generator function) until the
    /// runtime shuts down and in-flight streams have drained.
    fn serve_endpoint(&self, py: Python<'_>, handler: Py<PyAny>) -> PyResult<Py<PyAny>> {
        let dispatch = py.import("dynamo.runtime._serving")?.getattr("make_dispatcher")?.call1((handler,))?;
        let handler = Arc::new(PyHandler { bridge: self.bridge.clone(), dispatch: Arc::new(dispatch.unbind()) });
        let ep = self.inner.clone();
        let served = self.bridge.awaitable(py, async move { ep.serve(handler).await.map_err(to_py) }, |py, ()| Ok(py.None()));
        coroutine(py, served)
    }

    /// A client of this endpoint.
    fn client(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let ep = self.inner.clone();
        let bridge = self.bridge.clone();
        let client = self.bridge.awaitable(
            py,
            async move { ep.client().await.map_err(to_py) },
            move |py, client| Ok(Py::new(py, PyClient { inner: client, bridge })?.into_any()),
        );
        coroutine(py, client)
    }

    /// The instance id this endpoint registers with (the process's instance id).
    fn lease_id(&self) -> u64 {
        self.inner.planes().instance_id()
    }

    /// The endpoint's name.
    fn name(&self) -> String {
        self.inner.id().name.clone()
    }

    /// `namespace.component.endpoint`.
    fn path(&self) -> String {
        self.inner.id().to_string()
    }
}

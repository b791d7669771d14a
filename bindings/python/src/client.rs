//! `Client`, `ResponseStream` and `Annotated` for Python.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use dynamo_runtime::{Client, Result as RtResult, ResponseItem, ResponseStream, RouterMode};
use pyo3::prelude::*;

use crate::bridge::LoopBridge;
use crate::convert::{from_json, to_json};
use crate::errors::to_py;
use crate::poll_iter::{PollIter, Source};

/// A client of one endpoint.
#[pyclass(name = "Client", module = "dynamo._core", frozen)]
pub struct PyClient {
    pub inner: Client,
    pub bridge: Arc<LoopBridge>,
}

impl PyClient {
    fn send(&self, py: Python<'_>, mode: RouterMode, request: &Bound<'_, PyAny>, annotated: bool) -> PyResult<Py<PyAny>> {
        let body = to_json(request)?;
        let client = self.inner.clone();
        let bridge = self.bridge.clone();
        self.bridge.awaitable(
            py,
            async move { client.send(mode, body, None).await.map_err(to_py) },
            move |py, stream| Ok(Py::new(py, PyResponseStream::new(stream, bridge, annotated))?.into_any()),
        )
    }
}

#[pymethods]
impl PyClient {
    /// Ids of the registered instances, ascending.
    fn instance_ids(&self) -> Vec<u64> {
        self.inner.instance_ids()
    }

    /// The registered instances as dicts (`instance_id`, `namespace`, `component`,
    /// `endpoint`, `transport`), ordered by id.
    fn instances(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let instances = self.inner.instances();
        Ok(pythonize::pythonize(py, &instances).map_err(|e| pyo3::exceptions::PyValueError::new_err(e.to_string()))?.unbind())
    }

    /// Same as `instance_ids()` (name used by other Dynamo versions).
    fn endpoint_ids(&self) -> Vec<u64> {
        self.inner.instance_ids()
    }

    /// Wait until an instance is registered; returns the ids.
    #[pyo3(signature = (timeout=None))]
    fn wait_for_instances(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Py<PyAny>> {
        let client = self.inner.clone();
        let timeout = timeout.map(Duration::from_secs_f64);
        let waited = self.bridge.awaitable(
            py,
            async move { client.wait_for_instances(timeout).await.map_err(to_py) },
            |py, ids| Ok(ids.into_pyobject(py)?.into_any().unbind()),
        );
        crate::bridge::coroutine(py, waited)
    }

    /// Send to the next instance in turn (the default).
    #[pyo3(signature = (request, annotated=true))]
    fn generate(&self, py: Python<'_>, request: &Bound<'_, PyAny>, annotated: bool) -> PyResult<Py<PyAny>> {
        self.send(py, RouterMode::RoundRobin, request, annotated)
    }

    /// Send to the next instance in turn.
    #[pyo3(signature = (request, annotated=true))]
    fn round_robin(&self, py: Python<'_>, request: &Bound<'_, PyAny>, annotated: bool) -> PyResult<Py<PyAny>> {
        self.send(py, RouterMode::RoundRobin, request, annotated)
    }

    /// Send to a random instance.
    #[pyo3(signature = (request, annotated=true))]
    fn random(&self, py: Python<'_>, request: &Bound<'_, PyAny>, annotated: bool) -> PyResult<Py<PyAny>> {
        self.send(py, RouterMode::Random, request, annotated)
    }

    /// Send to one instance by id.
    #[pyo3(signature = (request, instance_id, annotated=true))]
    fn direct(&self, py: Python<'_>, request: &Bound<'_, PyAny>, instance_id: u64, annotated: bool) -> PyResult<Py<PyAny>> {
        self.send(py, RouterMode::Direct(instance_id), request, annotated)
    }
}

struct StreamSource {
    stream: ResponseStream,
    annotated: bool,
}

impl Source for StreamSource {
    type Item = RtResult<ResponseItem>;

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.poll_item(cx)
    }

    fn convert(&self, py: Python<'_>, item: Self::Item) -> PyResult<Option<Py<PyAny>>> {
        let item = item.map_err(to_py)?;
        if !self.annotated {
            if item.body.is_empty() {
                return Ok(None);
            }
            return from_json(py, &item.body).map(Some);
        }
        let annotations: serde_json::Value =
            if item.header.is_empty() { serde_json::Value::Null } else { serde_json::from_slice(&item.header).unwrap_or_default() };
        let data = from_json(py, &item.body)?;
        let text = |k: &str| annotations.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let comments = annotations
            .get("comment")
            .and_then(|v| v.as_array())
            .map(|a| a.iter().map(|c| c.as_str().map(str::to_string).unwrap_or_else(|| c.to_string())).collect());
        let annotated = Annotated { data, id: text("id"), event: text("event"), comments };
        Ok(Some(Py::new(py, annotated)?.into_any()))
    }
}

/// The response items of one request, as an async iterator.
#[pyclass(name = "ResponseStream", module = "dynamo._core", frozen)]
pub struct PyResponseStream {
    iter: Arc<PollIter<StreamSource>>,
}

impl PyResponseStream {
    fn new(stream: ResponseStream, bridge: Arc<LoopBridge>, annotated: bool) -> Self {
        PyResponseStream { iter: PollIter::new(StreamSource { stream, annotated }, bridge) }
    }
}

#[pymethods]
impl PyResponseStream {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.iter.anext(py)
    }

    /// Ask the worker to stop generating; remaining items and the end still arrive.
    fn stop_generating(&self) {
        self.iter.with_source(|s| s.stream.stop_generating());
    }

    /// Abandon the stream: the worker drops it, iteration ends.
    fn kill(&self) {
        self.iter.with_source(|s| s.stream.kill());
    }

    /// Whether the stream has ended.
    fn is_done(&self) -> bool {
        self.iter.with_source(|s| s.stream.is_done())
    }
}

/// A response item with its annotations.
#[pyclass(name = "Annotated", module = "dynamo._core", frozen)]
pub struct Annotated {
    data: Py<PyAny>,
    id: Option<String>,
    event: Option<String>,
    comments: Option<Vec<String>>,
}

#[pymethods]
impl Annotated {
    /// The item's data.
    fn data(&self, py: Python<'_>) -> Py<PyAny> {
        self.data.clone_ref(py)
    }

    /// The item's id, if any.
    fn id(&self) -> Option<String> {
        self.id.clone()
    }

    /// The event name, if the item is an annotation.
    fn event(&self) -> Option<String> {
        self.event.clone()
    }

    /// The comments of an annotation.
    fn comments(&self) -> Option<Vec<String>> {
        self.comments.clone()
    }

    /// Whether the item is an error annotation (errors normally raise instead).
    fn is_error(&self) -> bool {
        self.event.as_deref() == Some("error")
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let data = self.data.bind(py).repr().map(|r| r.to_string()).unwrap_or_default();
        format!("Annotated(data={data}, event={:?}, comments={:?}, id={:?})", self.event, self.comments, self.id)
    }
}

//! The discovery plane's key-value store for Python (`runtime.kv_store()`, and
//! `runtime.etcd_client()` for scripts written against the reference API).

use std::sync::Arc;

use bytes::Bytes;
use dynamo_runtime::discovery::Discovery;
use dynamo_runtime::{Error, ErrorKind};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::bridge::LoopBridge;
use crate::errors::to_py;

/// Keys and values in the discovery backend (etcd, file or mem).
#[pyclass(name = "KeyValueStore", module = "dynamo._core", frozen)]
pub struct PyKeyValueStore {
    pub discovery: Arc<dyn Discovery>,
    pub bridge: Arc<LoopBridge>,
}

impl PyKeyValueStore {
    /// Whether a write with `lease_id` is bound to this process's lease (`None` or the
    /// process's own lease id) or unleased (`0`).
    fn leased(&self, lease_id: Option<i64>) -> PyResult<bool> {
        match lease_id {
            None => Ok(true),
            Some(0) => Ok(false),
            Some(id) if id == self.discovery.lease_id() => Ok(true),
            Some(id) => Err(to_py(Error::new(
                ErrorKind::Config,
                format!("lease {id} is not this process's lease ({}); use None or 0", self.discovery.lease_id()),
            ))),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        py: Python<'_>,
        fut: impl std::future::Future<Output = dynamo_runtime::Result<T>> + Send + 'static,
        convert: impl FnOnce(Python<'_>, T) -> PyResult<Py<PyAny>> + Send + 'static,
    ) -> PyResult<Py<PyAny>> {
        self.bridge.awaitable(py, async move { fut.await.map_err(to_py) }, convert)
    }
}

fn none(py: Python<'_>, _: ()) -> PyResult<Py<PyAny>> {
    Ok(py.None())
}

#[pymethods]
impl PyKeyValueStore {
    /// This process's lease id (keys written with it vanish when the process dies).
    fn primary_lease_id(&self) -> i64 {
        self.discovery.lease_id()
    }

    /// Create `key`; fails if it exists.
    #[pyo3(signature = (key, value, lease_id=None))]
    fn kv_create(&self, py: Python<'_>, key: String, value: Vec<u8>, lease_id: Option<i64>) -> PyResult<Py<PyAny>> {
        if !self.leased(lease_id)? {
            return Err(to_py(Error::new(ErrorKind::Config, "kv_create needs a lease (None or primary_lease_id())")));
        }
        let d = self.discovery.clone();
        self.run(py, async move { d.create_leased(&key, Bytes::from(value)).await }, none)
    }

    /// Create `key`, or succeed if it already holds exactly `value`.
    #[pyo3(signature = (key, value, lease_id=None))]
    fn kv_create_or_validate(&self, py: Python<'_>, key: String, value: Vec<u8>, lease_id: Option<i64>) -> PyResult<Py<PyAny>> {
        self.leased(lease_id)?;
        let d = self.discovery.clone();
        self.run(
            py,
            async move {
                match d.create_leased(&key, Bytes::from(value.clone())).await {
                    Err(e) if e.kind() == ErrorKind::AlreadyExists => match d.get(&key).await? {
                        Some(existing) if existing[..] == value[..] => Ok(()),
                        _ => Err(Error::new(ErrorKind::AlreadyExists, format!("key {key} exists with a different value"))),
                    },
                    other => other,
                }
            },
            none,
        )
    }

    /// Write `key` (bound to this process's lease unless `lease_id` is 0).
    #[pyo3(signature = (key, value, lease_id=None))]
    fn kv_put(&self, py: Python<'_>, key: String, value: Vec<u8>, lease_id: Option<i64>) -> PyResult<Py<PyAny>> {
        let leased = self.leased(lease_id)?;
        let d = self.discovery.clone();
        self.run(
            py,
            async move {
                if leased {
                    d.put_leased(&key, Bytes::from(value)).await
                } else {
                    d.put(&key, Bytes::from(value)).await
                }
            },
            none,
        )
    }

    /// The value of `key`, or None.
    fn kv_get(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let d = self.discovery.clone();
        self.run(py, async move { d.get(&key).await }, |py, v| {
            Ok(match v {
                Some(b) => PyBytes::new(py, &b).into_any().unbind(),
                None => py.None(),
            })
        })
    }

    /// Every key under `prefix` as `{"key": str, "value": bytes}`, in key order.
    fn kv_get_prefix(&self, py: Python<'_>, prefix: String) -> PyResult<Py<PyAny>> {
        let d = self.discovery.clone();
        self.run(py, async move { d.get_prefix(&prefix).await }, |py, kvs| {
            let out = pyo3::types::PyList::empty(py);
            for kv in kvs {
                let item = PyDict::new(py);
                item.set_item("key", kv.key)?;
                item.set_item("value", PyBytes::new(py, &kv.value))?;
                out.append(item)?;
            }
            Ok(out.into_any().unbind())
        })
    }

    /// Delete `key`.
    fn kv_delete(&self, py: Python<'_>, key: String) -> PyResult<Py<PyAny>> {
        let d = self.discovery.clone();
        self.run(py, async move { d.delete(&key).await }, none)
    }
}

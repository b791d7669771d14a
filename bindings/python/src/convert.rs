//! Python objects ↔ JSON bytes, transcoded directly (no intermediate `serde_json::Value`).

use bytes::Bytes;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::intern;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};

/// Serialize a JSON-like Python object (pydantic models via `model_dump(mode="json")`).
pub fn to_json(obj: &Bound<'_, PyAny>) -> PyResult<Bytes> {
    let dumped;
    // Plain JSON values skip the `model_dump` probe: a failed attribute lookup builds
    // and discards an AttributeError, which dominated streaming profiles.
    let plain = obj.is_none()
        || obj.is_exact_instance_of::<PyDict>()
        || obj.is_exact_instance_of::<PyList>()
        || obj.is_exact_instance_of::<PyString>()
        || obj.is_exact_instance_of::<PyInt>()
        || obj.is_exact_instance_of::<PyFloat>()
        || obj.is_exact_instance_of::<PyBool>();
    let obj = if !plain && obj.hasattr(intern!(obj.py(), "model_dump"))? {
        let kwargs = PyDict::new(obj.py());
        kwargs.set_item("mode", "json")?;
        dumped = obj.call_method("model_dump", (), Some(&kwargs))?;
        &dumped
    } else {
        obj
    };
    let mut out = Vec::with_capacity(64);
    let mut de = pythonize::Depythonizer::from_object(obj);
    let mut ser = serde_json::Serializer::new(&mut out);
    serde_transcode::transcode(&mut de, &mut ser)
        .map_err(|e| PyTypeError::new_err(format!("not JSON-serializable: {e}")))?;
    Ok(out.into())
}

/// Parse JSON bytes into Python objects.
pub fn from_json(py: Python<'_>, data: &[u8]) -> PyResult<Py<PyAny>> {
    if data.is_empty() {
        return Ok(py.None());
    }
    let mut de = serde_json::Deserializer::from_slice(data);
    let obj = serde_transcode::transcode(&mut de, pythonize::Pythonizer::new(py))
        .map_err(|e| PyValueError::new_err(format!("invalid JSON in a message: {e}")))?;
    Ok(obj.unbind())
}

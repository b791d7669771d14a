//! Python exceptions for runtime errors, one class per kind a caller may handle.

use dynamo_runtime::{Error, ErrorKind};
use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

create_exception!(_core, DynamoError, PyException, "Base class of the runtime's errors.");
create_exception!(_core, ConfigError, DynamoError, "A configuration value is missing or invalid.");
create_exception!(_core, NoInstancesError, DynamoError, "No instance of the endpoint is registered.");
create_exception!(_core, InstanceNotFoundError, DynamoError, "The requested instance id is not registered.");
create_exception!(_core, StreamDisconnectedError, DynamoError, "The worker is unreachable or died mid-stream.");
create_exception!(_core, DynamoTimeoutError, DynamoError, "A bounded wait ran out.");
create_exception!(_core, PayloadTooLargeError, DynamoError, "A message exceeds the plane's size limit.");
create_exception!(_core, HandlerError, PyValueError, "The remote handler raised; the message is the handler's.");

/// Convert a runtime error into the matching Python exception.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.full_message();
    match e.kind() {
        ErrorKind::Config => ConfigError::new_err(msg),
        ErrorKind::NoInstances => NoInstancesError::new_err(msg),
        ErrorKind::InstanceNotFound => InstanceNotFoundError::new_err(msg),
        ErrorKind::Disconnected | ErrorKind::Unavailable => StreamDisconnectedError::new_err(msg),
        ErrorKind::Timeout | ErrorKind::NotTaken => DynamoTimeoutError::new_err(msg),
        ErrorKind::PayloadTooLarge => PayloadTooLargeError::new_err(msg),
        ErrorKind::Handler => HandlerError::new_err(msg),
        other => DynamoError::new_err(format!("[{other}] {msg}")),
    }
}

/// Register the exception classes on the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("DynamoError", py.get_type::<DynamoError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("NoInstancesError", py.get_type::<NoInstancesError>())?;
    m.add("InstanceNotFoundError", py.get_type::<InstanceNotFoundError>())?;
    m.add("StreamDisconnectedError", py.get_type::<StreamDisconnectedError>())?;
    m.add("DynamoTimeoutError", py.get_type::<DynamoTimeoutError>())?;
    m.add("PayloadTooLargeError", py.get_type::<PayloadTooLargeError>())?;
    m.add("HandlerError", py.get_type::<HandlerError>())?;
    Ok(())
}

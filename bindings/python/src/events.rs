//! Event subscriptions for Python.

use std::sync::Arc;
use std::task::{Context, Poll};

use dynamo_runtime::events::{Event, Subscription};
use pyo3::prelude::*;

use crate::bridge::LoopBridge;
use crate::convert::from_json;
use crate::poll_iter::{PollIter, Source};

struct EventSource(Subscription);

impl Source for EventSource {
    type Item = Event;

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Event>> {
        self.0.poll_event(cx)
    }

    fn convert(&self, py: Python<'_>, event: Event) -> PyResult<Option<Py<PyAny>>> {
        from_json(py, &event.payload).map(Some)
    }
}

/// Events of one subject, decoded from JSON, as an async iterator.
#[pyclass(name = "Subscription", module = "dynamo._core", frozen)]
pub struct PySubscription {
    iter: Arc<PollIter<EventSource>>,
}

impl PySubscription {
    pub fn new(sub: Subscription, bridge: Arc<LoopBridge>) -> Self {
        PySubscription { iter: PollIter::new(EventSource(sub), bridge) }
    }
}

#[pymethods]
impl PySubscription {
    fn __aiter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    fn __anext__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.iter.anext(py)
    }
}

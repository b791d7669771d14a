//! The output parsers (`dynamo_llm::parsers`) for Python processors: whole-text
//! `parse_tool_calls` / `parse_reasoning`, and `ToolCallStream` / `ReasoningStream`
//! for streams. Conversion only.

use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use dynamo_llm::parsers::reasoning::parse_whole as reasoning_whole;
use dynamo_llm::parsers::tool_calls::parse_whole as tool_calls_whole;
use dynamo_llm::parsers::{
    reasoning_parser, tool_call_parser, ReasoningParser, ToolCallDelta, ToolCallParser, UnknownParser,
    REASONING_PARSERS, TOOL_CALL_PARSERS,
};

fn unknown(e: UnknownParser) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// Split a whole response into `(content, calls)`: content `None` when there is none,
/// each call `{"name": ..., "arguments": <JSON text>}`.
#[pyfunction]
#[pyo3(signature = (parser, text, tools=None))]
fn parse_tool_calls<'py>(
    py: Python<'py>,
    parser: &str,
    text: &str,
    tools: Option<Vec<String>>,
) -> PyResult<Bound<'py, PyTuple>> {
    let mut parser = tool_call_parser(parser, tools).map_err(unknown)?;
    let (content, calls, _cut) = py.detach(|| tool_calls_whole(parser.as_mut(), text));
    let list = PyList::empty(py);
    for call in calls {
        let dict = PyDict::new(py);
        dict.set_item("name", call.name)?;
        dict.set_item("arguments", call.arguments)?;
        list.append(dict)?;
    }
    PyTuple::new(py, [content.into_pyobject(py)?.into_any(), list.into_any()])
}

/// Split a whole response into `(reasoning, content)`, each `None` when empty.
#[pyfunction]
#[pyo3(signature = (parser, text, enable_thinking=true))]
fn parse_reasoning(
    py: Python<'_>,
    parser: &str,
    text: &str,
    enable_thinking: bool,
) -> PyResult<(Option<String>, Option<String>)> {
    let mut parser = reasoning_parser(parser, enable_thinking).map_err(unknown)?;
    Ok(py.detach(|| reasoning_whole(parser.as_mut(), text)))
}

/// One OpenAI `tool_calls[i]` delta as a dict.
fn call_dict<'py>(py: Python<'py>, call: ToolCallDelta) -> PyResult<Bound<'py, PyDict>> {
    let function = PyDict::new(py);
    if let Some(name) = call.name {
        function.set_item("name", name)?;
    }
    function.set_item("arguments", call.arguments)?;
    let dict = PyDict::new(py);
    dict.set_item("index", call.index)?;
    if let Some(id) = call.id {
        dict.set_item("id", id)?;
        dict.set_item("type", "function")?;
    }
    dict.set_item("function", function)?;
    Ok(dict)
}

/// An incremental tool-call parser for one response.
#[pyclass(name = "ToolCallStream", module = "dynamo._core")]
pub struct PyToolCallStream {
    // Each delta is parsed in well under a microsecond: cheaper than releasing the GIL.
    parser: Mutex<Box<dyn ToolCallParser>>,
    cut: bool,
}

impl PyToolCallStream {
    fn convert<'py>(
        py: Python<'py>,
        delta: dynamo_llm::parsers::ParsedDelta,
    ) -> PyResult<(String, Bound<'py, PyList>)> {
        let list = PyList::empty(py);
        for call in delta.calls {
            list.append(call_dict(py, call)?)?;
        }
        Ok((delta.content, list))
    }
}

#[pymethods]
impl PyToolCallStream {
    /// A parser registered as `parser`; `tools`: the function names a call may use.
    #[new]
    #[pyo3(signature = (parser, tools=None))]
    fn new(parser: &str, tools: Option<Vec<String>>) -> PyResult<Self> {
        Ok(PyToolCallStream { parser: Mutex::new(tool_call_parser(parser, tools).map_err(unknown)?), cut: false })
    }

    /// Feed a text delta: `(content, tool_calls)`, the calls in OpenAI's delta shape.
    fn push<'py>(&self, py: Python<'py>, delta: &str) -> PyResult<(String, Bound<'py, PyList>)> {
        let out = self.parser.lock().push(delta);
        Self::convert(py, out)
    }

    /// The stream has ended: what was held back, as `push` returns it.
    fn finish<'py>(&mut self, py: Python<'py>) -> PyResult<(String, Bound<'py, PyList>)> {
        let out = self.parser.lock().finish();
        self.cut = out.cut;
        Self::convert(py, out)
    }

    /// After `finish`: whether the stream ended inside tool-call markup.
    #[getter]
    fn cut(&self) -> bool {
        self.cut
    }
}

/// An incremental reasoning parser for one response.
#[pyclass(name = "ReasoningStream", module = "dynamo._core")]
pub struct PyReasoningStream {
    parser: Mutex<Box<dyn ReasoningParser>>,
}

#[pymethods]
impl PyReasoningStream {
    /// A parser registered as `parser`; `enable_thinking`: the request's switch.
    #[new]
    #[pyo3(signature = (parser, enable_thinking=true))]
    fn new(parser: &str, enable_thinking: bool) -> PyResult<Self> {
        Ok(PyReasoningStream { parser: Mutex::new(reasoning_parser(parser, enable_thinking).map_err(unknown)?) })
    }

    /// Feed a text delta: `(reasoning, content)`, either may be empty.
    fn push(&self, delta: &str) -> (String, String) {
        let out = self.parser.lock().push(delta);
        (out.reasoning, out.content)
    }

    /// The stream has ended: what was held back, as `push` returns it.
    fn finish(&self) -> (String, String) {
        let out = self.parser.lock().finish();
        (out.reasoning, out.content)
    }
}

/// Add the parsers to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(parse_tool_calls, m)?)?;
    m.add_function(wrap_pyfunction!(parse_reasoning, m)?)?;
    m.add_class::<PyToolCallStream>()?;
    m.add_class::<PyReasoningStream>()?;
    m.add("TOOL_CALL_PARSERS", PyTuple::new(m.py(), TOOL_CALL_PARSERS)?)?;
    m.add("REASONING_PARSERS", PyTuple::new(m.py(), REASONING_PARSERS)?)?;
    Ok(())
}

//! `dynamo._core`: thin PyO3 wrappers over `dynamo-runtime` and `dynamo-llm`. Conversion and the
//! asyncio bridge live here; behaviour lives in the runtime crate and in `python/dynamo`.

mod bridge;
mod client;
mod convert;
mod disagg;
mod errors;
mod events;
mod int_list;
mod kv;
mod kv_index;
mod kv_router;
mod llm;
mod parsers;
mod planner_lab;
mod poll_iter;
mod preprocessor;
mod runtime;
mod serving;

use pyo3::prelude::*;
use pyo3::types::PyTuple;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<runtime::PyDistributedRuntime>()?;
    m.add_class::<runtime::PyNamespace>()?;
    m.add_class::<runtime::PyComponent>()?;
    m.add_class::<runtime::PyEndpoint>()?;
    m.add_function(wrap_pyfunction!(runtime::drain_bound_s, m)?)?;
    m.add_class::<client::PyClient>()?;
    m.add_class::<client::PyResponseStream>()?;
    m.add_class::<client::Annotated>()?;
    m.add_class::<serving::PyRequestContext>()?;
    m.add_class::<events::PySubscription>()?;
    m.add_class::<kv::PyKeyValueStore>()?;
    m.add_class::<preprocessor::PyOpenAIPreprocessor>()?;
    m.add_class::<preprocessor::PyPreprocessed>()?;
    m.add_class::<preprocessor::PyChunkStream>()?;
    errors::register(m)?;
    llm::register(m)?;
    parsers::register(m)?;
    disagg::register(m)?;
    kv_index::register(m)?;
    kv_router::register(m)?;
    planner_lab::register(m)?;
    m.add("ROUTER_MODES", PyTuple::new(m.py(), dynamo_llm::routing::RouterMode::NAMES)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

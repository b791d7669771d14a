//! The planner lab from Python: `PlannerLab` (a simulated mocker fleet stepped on a
//! virtual clock and resized between steps) and `planner_lab_point` (one simulated
//! replica measured at a fixed concurrency). The work runs without the GIL.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use dynamo_llm::lab_trace::{lab_engine_args, read_trace, LabError, TraceRequest};
use dynamo_llm::planner_lab::{closed_loop_point, PlannerLab, PlannerLabConfig};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn lab_error(e: LabError) -> PyErr {
    match e {
        LabError::Read { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A simulated fleet replaying a trace on a virtual clock: `advance` runs it to a time
/// and returns that window's statistics, `set_replicas` resizes it (new replicas are
/// ready after `startup_s` and warm up for `warmup_s`; removed ones drain).
#[pyclass(name = "PlannerLab", module = "dynamo._core", frozen)]
pub struct PyPlannerLab {
    inner: Mutex<PlannerLab>,
}

impl PyPlannerLab {
    fn lab(&self) -> PyResult<MutexGuard<'_, PlannerLab>> {
        self.inner.lock().map_err(|_| PyRuntimeError::new_err("the planner lab failed in an earlier call"))
    }
}

#[pymethods]
impl PyPlannerLab {
    #[new]
    #[pyo3(signature = (trace_path=None, requests=None, *, replicas=1, trace_block_size=512, time_scale=1.0, startup_s=30.0, warmup_s=10.0, warmup_factor=2.0, seed=0, engine_args=None, busy_threshold=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        trace_path: Option<PathBuf>,
        requests: Option<Vec<(f64, usize, usize)>>,
        replicas: usize,
        trace_block_size: usize,
        time_scale: f64,
        startup_s: f64,
        warmup_s: f64,
        warmup_factor: f64,
        seed: u64,
        engine_args: Option<&str>,
        busy_threshold: Option<f64>,
    ) -> PyResult<Self> {
        let mut engine = lab_engine_args(engine_args).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?;
        engine.seed = seed;
        let config = PlannerLabConfig { replicas, trace_block_size, engine, time_scale, startup_s, warmup_s, warmup_factor, busy_threshold };
        let trace = match (trace_path, requests) {
            (Some(path), None) => py.detach(|| read_trace(&path)).map_err(lab_error)?,
            (None, Some(requests)) => requests
                .into_iter()
                .map(|(timestamp, input_length, output_length)| TraceRequest { timestamp, input_length, output_length, hash_ids: Vec::new() })
                .collect(),
            _ => return Err(PyValueError::new_err("give either trace_path or requests")),
        };
        let lab = py.detach(|| PlannerLab::new(trace, config)).map_err(lab_error)?;
        Ok(PyPlannerLab { inner: Mutex::new(lab) })
    }

    /// Run to `until_s` simulated seconds; the window's statistics as a dict.
    fn advance<'py>(&self, py: Python<'py>, until_s: f64) -> PyResult<Bound<'py, PyDict>> {
        let w = {
            let mut guard = self.lab()?;
            let lab: &mut PlannerLab = &mut guard;
            py.detach(|| lab.advance(until_s)).map_err(lab_error)?
        };
        let d = PyDict::new(py);
        d.set_item("start_s", w.start_s)?;
        d.set_item("end_s", w.end_s)?;
        d.set_item("arrivals", w.arrivals)?;
        d.set_item("arrival_input_tokens", w.arrival_input_tokens)?;
        d.set_item("rejected", w.rejected)?;
        d.set_item("failed_at_scale_down", w.failed_at_scale_down)?;
        d.set_item("frontend_queue", w.frontend_queue)?;
        d.set_item("inflight", w.inflight)?;
        d.set_item("replica_seconds", w.replica_seconds)?;
        let finished = PyDict::new(py);
        finished.set_item("index", w.finished.iter().map(|f| f.index).collect::<Vec<_>>())?;
        finished.set_item("arrival_s", w.finished.iter().map(|f| f.arrival_s).collect::<Vec<_>>())?;
        finished.set_item("ttft_ms", w.finished.iter().map(|f| f.ttft_ms).collect::<Vec<_>>())?;
        finished.set_item("itl_ms", w.finished.iter().map(|f| f.itl_ms).collect::<Vec<_>>())?;
        finished.set_item("input_length", w.finished.iter().map(|f| f.input_length).collect::<Vec<_>>())?;
        finished.set_item("replica", w.finished.iter().map(|f| f.replica).collect::<Vec<_>>())?;
        d.set_item("finished", finished)?;
        let mut replicas = Vec::with_capacity(w.replicas.len());
        for r in &w.replicas {
            let item = PyDict::new(py);
            item.set_item("id", r.id)?;
            item.set_item("state", r.state.as_str())?;
            item.set_item("ready_s", r.ready_s)?;
            item.set_item("running", r.running)?;
            item.set_item("waiting", r.waiting)?;
            item.set_item("kv_active_blocks", r.kv_active_blocks)?;
            replicas.push(item);
        }
        d.set_item("replicas", replicas)?;
        Ok(d)
    }

    /// Resize to `n` replicas starting or ready (see the class docstring).
    fn set_replicas(&self, n: usize) -> PyResult<()> {
        self.lab()?.set_replicas(n).map_err(lab_error)
    }

    /// Replicas `(starting, ready, draining)`.
    fn counts(&self) -> PyResult<(usize, usize, usize)> {
        Ok(self.lab()?.counts())
    }

    /// The simulated time, seconds.
    #[getter]
    fn now_s(&self) -> PyResult<f64> {
        Ok(self.lab()?.now_s())
    }

    /// The last arrival, seconds.
    #[getter]
    fn last_arrival_s(&self) -> PyResult<f64> {
        Ok(self.lab()?.last_arrival_s())
    }

    /// Whether every request has arrived and ended.
    #[getter]
    fn done(&self) -> PyResult<bool> {
        Ok(self.lab()?.done())
    }

    /// Replica-seconds spent so far.
    #[getter]
    fn replica_seconds(&self) -> PyResult<f64> {
        Ok(self.lab()?.replica_seconds())
    }
}

/// One simulated replica holding `concurrency` requests of `isl` prompt tokens and `osl`
/// output tokens until `requests` finished (the first `concurrency` left out): a dict of
/// `ttft_ms` and `itl_ms` at `quantile`, and `throughput_rps`.
#[pyfunction]
#[pyo3(signature = (isl, osl, concurrency, requests, quantile=0.9, engine_args=None))]
pub fn planner_lab_point<'py>(
    py: Python<'py>,
    isl: usize,
    osl: usize,
    concurrency: usize,
    requests: usize,
    quantile: f64,
    engine_args: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let engine = lab_engine_args(engine_args).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?;
    let point = py.detach(|| closed_loop_point(&engine, isl, osl, concurrency, requests, quantile)).map_err(lab_error)?;
    let d = PyDict::new(py);
    d.set_item("ttft_ms", point.ttft_ms)?;
    d.set_item("itl_ms", point.itl_ms)?;
    d.set_item("throughput_rps", point.throughput_rps)?;
    Ok(d)
}

/// Add this module's functions and classes to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyPlannerLab>()?;
    m.add_function(wrap_pyfunction!(planner_lab_point, m)?)?;
    Ok(())
}

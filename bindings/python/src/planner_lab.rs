//! The planner lab from Python: `PlannerLab` (a simulated mocker fleet stepped on a
//! virtual clock and resized between steps) and `planner_lab_point` (one simulated
//! replica measured at a fixed concurrency). The work runs without the GIL.

use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

use dynamo_llm::lab_trace::{lab_engine_args, read_trace, LabError, TraceRequest};
use dynamo_llm::disagg::{DisaggConfig, DisaggRole, DEFAULT_MAX_LOCAL_PREFILL_LENGTH, DEFAULT_MAX_PREFILL_QUEUE_SIZE};
use dynamo_llm::planner_lab::{closed_loop_point, DisaggPools, PlannerLab, PlannerLabConfig};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

// The keyword defaults of `PlannerLab` are written as literals (so that Python sees their
// values); they are the decode worker's.
const _: () = assert!(DEFAULT_MAX_LOCAL_PREFILL_LENGTH == 1000 && DEFAULT_MAX_PREFILL_QUEUE_SIZE == 2);

fn lab_error(e: LabError) -> PyErr {
    match e {
        LabError::Read { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// A simulated fleet replaying a trace on a virtual clock: `advance` runs it to a time
/// and returns that window's statistics, `set_replicas` resizes it (new replicas are
/// ready after `startup_s` and warm up for `warmup_s`; removed ones drain). With
/// `prefill_replicas` and `decode_replicas` it is disaggregated: two pools, each resized
/// with `set_replicas(n, role=...)`; a decode replica prefills a prompt remotely when its
/// uncached part is longer than `max_local_prefill_length` and the prefill queue holds
/// fewer than `max_prefill_queue_size` jobs (the decode worker's defaults).
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
    #[pyo3(signature = (trace_path=None, requests=None, *, replicas=1, trace_block_size=512, time_scale=1.0, startup_s=30.0, warmup_s=10.0, warmup_factor=2.0, seed=0, engine_args=None, busy_threshold=None, busy_wait_s=None, prefill_replicas=None, decode_replicas=None, max_local_prefill_length=1000, max_prefill_queue_size=2))]
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
        busy_wait_s: Option<f64>,
        prefill_replicas: Option<usize>,
        decode_replicas: Option<usize>,
        max_local_prefill_length: usize,
        max_prefill_queue_size: usize,
    ) -> PyResult<Self> {
        let mut engine = lab_engine_args(engine_args).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?;
        engine.seed = seed;
        let (replicas, disagg) = match (prefill_replicas, decode_replicas) {
            (None, None) => (replicas, None),
            (Some(prefill_replicas), Some(decode_replicas)) => {
                let settings = DisaggConfig { max_local_prefill_length, max_prefill_queue_size, ..DisaggConfig::default() };
                (0, Some(DisaggPools { prefill_replicas, decode_replicas, settings }))
            }
            _ => return Err(PyValueError::new_err("give both prefill_replicas and decode_replicas, or neither")),
        };
        let config = PlannerLabConfig { replicas, trace_block_size, engine, time_scale, startup_s, warmup_s, warmup_factor, busy_threshold, busy_wait_s, disagg };
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
        d.set_item("prefill_queue", w.prefill_queue)?;
        d.set_item("remote_prefills", w.remote_prefills)?;
        d.set_item("local_prefills", w.local_prefills)?;
        d.set_item("fallback_prefills", w.fallback_prefills)?;
        d.set_item("transferring", w.transferring)?;
        let role_seconds = PyDict::new(py);
        for (role, seconds) in &w.role_seconds {
            role_seconds.set_item(role.as_str(), seconds)?;
        }
        d.set_item("role_seconds", role_seconds)?;
        d.set_item("inflight", w.inflight)?;
        d.set_item("replica_seconds", w.replica_seconds)?;
        let finished = PyDict::new(py);
        finished.set_item("index", w.finished.iter().map(|f| f.index).collect::<Vec<_>>())?;
        finished.set_item("arrival_s", w.finished.iter().map(|f| f.arrival_s).collect::<Vec<_>>())?;
        finished.set_item("ttft_ms", w.finished.iter().map(|f| f.ttft_ms).collect::<Vec<_>>())?;
        finished.set_item("itl_ms", w.finished.iter().map(|f| f.itl_ms).collect::<Vec<_>>())?;
        finished.set_item("input_length", w.finished.iter().map(|f| f.input_length).collect::<Vec<_>>())?;
        finished.set_item("replica", w.finished.iter().map(|f| f.replica).collect::<Vec<_>>())?;
        finished.set_item("prefill_replica", w.finished.iter().map(|f| f.prefill_replica).collect::<Vec<_>>())?;
        d.set_item("finished", finished)?;
        let mut replicas = Vec::with_capacity(w.replicas.len());
        for r in &w.replicas {
            let item = PyDict::new(py);
            item.set_item("id", r.id)?;
            item.set_item("role", r.role.as_str())?;
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

    /// Resize to `n` replicas starting or ready (see the class docstring); `role`
    /// (`prefill` or `decode`) names the pool of a disaggregated lab.
    #[pyo3(signature = (n, role=None))]
    fn set_replicas(&self, n: usize, role: Option<&str>) -> PyResult<()> {
        let mut lab = self.lab()?;
        match role {
            None => lab.set_replicas(n),
            Some(role) => {
                let role = role.parse::<DisaggRole>().map_err(PyValueError::new_err)?;
                lab.set_role_replicas(role, n)
            }
        }
        .map_err(lab_error)
    }

    /// Replicas `(starting, ready, draining)`, of `role`'s pool when given.
    #[pyo3(signature = (role=None))]
    fn counts(&self, role: Option<&str>) -> PyResult<(usize, usize, usize)> {
        let lab = self.lab()?;
        match role {
            None => Ok(lab.counts()),
            Some(role) => {
                let role = role.parse::<DisaggRole>().map_err(PyValueError::new_err)?;
                if !lab.roles().contains(&role) {
                    return Err(PyValueError::new_err(format!("this lab has no {} pool", role.as_str())));
                }
                Ok(lab.role_counts(role))
            }
        }
    }

    /// The pools: `["agg"]`, or `["prefill", "decode"]`.
    #[getter]
    fn roles(&self) -> PyResult<Vec<&'static str>> {
        Ok(self.lab()?.roles().iter().map(|r| r.as_str()).collect())
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

    /// Replica-seconds spent so far, per pool.
    #[getter]
    fn role_seconds(&self) -> PyResult<std::collections::HashMap<&'static str, f64>> {
        let lab = self.lab()?;
        Ok(lab.roles().iter().map(|&r| (r.as_str(), lab.role_seconds(r))).collect())
    }
}

/// One simulated replica holding `concurrency` requests of `isl` prompt tokens and `osl`
/// output tokens until `requests` finished (the first `concurrency` left out): a dict of
/// `ttft_ms` and `itl_ms` at `quantile`, and `throughput_rps`. `role` `prefill`: one-token
/// requests; `decode`: prompts arriving cached (handed over); `agg`: both.
#[pyfunction]
#[pyo3(signature = (isl, osl, concurrency, requests, quantile=0.9, engine_args=None, *, role="agg"))]
#[allow(clippy::too_many_arguments)]
pub fn planner_lab_point<'py>(
    py: Python<'py>,
    isl: usize,
    osl: usize,
    concurrency: usize,
    requests: usize,
    quantile: f64,
    engine_args: Option<&str>,
    role: &str,
) -> PyResult<Bound<'py, PyDict>> {
    let engine = lab_engine_args(engine_args).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?;
    let role = role.parse::<DisaggRole>().map_err(PyValueError::new_err)?;
    let point =
        py.detach(|| closed_loop_point(&engine, isl, osl, concurrency, requests, quantile, role)).map_err(lab_error)?;
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

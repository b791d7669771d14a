//! KV routing from Python: `KvRouter` (chooses a worker of an endpoint for a prompt,
//! following its workers' KV events and load metrics) and the routing lab
//! (`run_routing_lab`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dynamo_llm::http::AdmissionLimits;
use dynamo_llm::routing_lab::{self as lab, LabConfig, LabError, Policy};
use dynamo_llm::kv_router::{KvRouter, KvRouterConfig, ScheduleError, SchedulerConfig, SelectorWeights};
use dynamo_runtime::Client;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::bridge::{block_on, ready};
use crate::errors::{to_py, DynamoError, NoInstancesError};
use crate::runtime::PyEndpoint;

/// Chooses, for a prompt's token ids, the instance of an endpoint to send it to: the
/// cached prefix each worker holds (from its KV events, or predicted from earlier
/// choices), its load (its load metrics plus what was chosen since), the temperature
/// and the busy threshold, as `dynamo-run --router-mode kv` does.
#[pyclass(name = "KvRouter", module = "dynamo._core", frozen)]
pub struct PyKvRouter {
    router: Arc<KvRouter>,
    client: Client,
}

impl PyKvRouter {
    fn choose(&self, token_ids: &[u32]) -> PyResult<(u64, usize)> {
        let live = self.client.instance_ids();
        match self.router.route(token_ids, &live) {
            Ok(d) => Ok((d.worker, d.overlap_blocks)),
            Err(e @ ScheduleError::NoWorkers) => Err(NoInstancesError::new_err(format!("{e} of {}", self.client.endpoint()))),
            Err(e @ ScheduleError::AllBusy { .. }) => Err(DynamoError::new_err(e.to_string())),
        }
    }
}

#[pymethods]
impl PyKvRouter {
    #[new]
    #[pyo3(signature = (endpoint, block_size=16, overlap_weight=8.0, temperature=0.0, busy_threshold=None, use_kv_events=true, replica_sync=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        endpoint: &PyEndpoint,
        block_size: u32,
        overlap_weight: f64,
        temperature: f64,
        busy_threshold: Option<f64>,
        use_kv_events: bool,
        replica_sync: bool,
    ) -> PyResult<Self> {
        if block_size == 0 {
            return Err(PyValueError::new_err("block_size must be at least 1"));
        }
        let scheduler = SchedulerConfig {
            weights: SelectorWeights { overlap_weight, temperature },
            busy_threshold,
            ..Default::default()
        };
        scheduler.validate().map_err(PyValueError::new_err)?;
        let config = KvRouterConfig { block_size, scheduler, use_kv_events, replica_sync, ..Default::default() };
        let endpoint = endpoint.inner.clone();
        block_on(py, async move {
            let client = endpoint.client().await?;
            let router = KvRouter::new(config);
            router.follow_component(endpoint.component()).await?;
            Ok::<_, dynamo_runtime::Error>(PyKvRouter { router, client })
        })
        .map_err(to_py)
    }

    /// Awaitable: the instance id to send a prompt of `token_ids` to. Raises
    /// `NoInstancesError` without instances, `DynamoError` when all are busy.
    fn schedule(&self, py: Python<'_>, token_ids: Vec<u32>) -> PyResult<Py<PyAny>> {
        let chosen = self.choose(&token_ids).and_then(|(worker, _)| Ok(worker.into_pyobject(py)?.into_any().unbind()));
        ready(py, chosen)
    }

    /// Awaitable: `(instance id, cached prefix blocks it holds)` for `token_ids`.
    fn best_worker(&self, py: Python<'_>, token_ids: Vec<u32>) -> PyResult<Py<PyAny>> {
        let chosen = self.choose(&token_ids).and_then(|pair| Ok(pair.into_pyobject(py)?.into_any().unbind()));
        ready(py, chosen)
    }

    /// Tokens per block.
    #[getter]
    fn block_size(&self) -> u32 {
        self.router.config().block_size
    }
}

fn lab_error(e: LabError) -> PyErr {
    match e {
        LabError::Read { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Replay the Mooncake-format trace at `trace_path` through `workers` simulated mocker
/// engines on a virtual clock, routing with `policy` (`kv`, `approx`, `round-robin`,
/// `random`), each arrival first through the frontend's admission limits when given;
/// returns the report as a dict. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (trace_path, policy, workers=4, trace_block_size=512, seed=0, slow_worker_factor=1.0, time_scale=1.0, overlap_weight=8.0, temperature=0.0, busy_threshold=None, engine_args=None, max_inflight_requests=None, max_queued_tokens=None, admission_ttft_ms=None))]
#[allow(clippy::too_many_arguments)]
pub fn run_routing_lab<'py>(
    py: Python<'py>,
    trace_path: PathBuf,
    policy: &str,
    workers: usize,
    trace_block_size: usize,
    seed: u64,
    slow_worker_factor: f64,
    time_scale: f64,
    overlap_weight: f64,
    temperature: f64,
    busy_threshold: Option<f64>,
    engine_args: Option<&str>,
    max_inflight_requests: Option<usize>,
    max_queued_tokens: Option<u64>,
    admission_ttft_ms: Option<f64>,
) -> PyResult<Bound<'py, PyDict>> {
    let policy: Policy = policy.parse().map_err(lab_error)?;
    let engine = lab::lab_engine_args(engine_args).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?;
    let config = LabConfig {
        workers,
        trace_block_size,
        engine,
        scheduler: SchedulerConfig {
            weights: SelectorWeights { overlap_weight, temperature },
            busy_threshold,
            ..Default::default()
        },
        slow_worker_factor,
        time_scale,
        seed,
        admission: AdmissionLimits {
            max_inflight_requests,
            max_queued_tokens,
            ttft_target: admission_ttft_ms
                .map(|ms| Duration::try_from_secs_f64(ms / 1000.0))
                .transpose()
                .map_err(|e| PyValueError::new_err(format!("admission_ttft_ms: {e}")))?,
        },
    };
    config.validate().map_err(lab_error)?;
    let report = py.detach(|| lab::read_trace(&trace_path).and_then(|trace| lab::run(&trace, policy, &config))).map_err(lab_error)?;
    let d = PyDict::new(py);
    d.set_item("policy", report.policy.as_str())?;
    d.set_item("requests", report.requests)?;
    d.set_item("completed", report.completed)?;
    d.set_item("admitted", report.admitted)?;
    d.set_item("refused", report.refused)?;
    d.set_item("rejected", report.rejected)?;
    d.set_item("hit_rate", report.hit_rate)?;
    d.set_item("ttft_p50_ms", report.ttft_p50_ms)?;
    d.set_item("ttft_p99_ms", report.ttft_p99_ms)?;
    d.set_item("itl_p50_ms", report.itl_p50_ms)?;
    d.set_item("throughput_tok_s", report.throughput_tok_s)?;
    d.set_item("load_imbalance", report.load_imbalance)?;
    d.set_item("per_worker", report.per_worker)?;
    d.set_item("simulated_s", report.simulated_s)?;
    d.set_item("ttft_ms", report.ttft_ms)?;
    Ok(d)
}

/// Add this module's functions and classes to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvRouter>()?;
    m.add_function(wrap_pyfunction!(run_routing_lab, m)?)?;
    Ok(())
}

//! KV routing from Python: the routing lab (`run_routing_lab`).

use std::path::PathBuf;

use dynamo_llm::kv_router::lab::{self, LabConfig, LabError, Policy};
use dynamo_llm::kv_router::{SchedulerConfig, SelectorWeights, DEFAULT_OVERLAP_WEIGHT};
use dynamo_llm::mocker::MockerArgs;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

fn lab_error(e: LabError) -> PyErr {
    match e {
        LabError::Read { .. } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// Replay the Mooncake-format trace at `trace_path` through `workers` simulated mocker
/// engines on a virtual clock, routing with `policy` (`kv`, `approx`, `round-robin`,
/// `random`); returns the report as a dict. Runs without the GIL.
#[pyfunction]
#[pyo3(signature = (trace_path, policy, workers=4, trace_block_size=lab::DEFAULT_TRACE_BLOCK_SIZE, seed=0, slow_worker_factor=1.0, time_scale=1.0, overlap_weight=DEFAULT_OVERLAP_WEIGHT, temperature=0.0, busy_threshold=None, engine_args=None))]
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
) -> PyResult<Bound<'py, PyDict>> {
    let policy: Policy = policy.parse().map_err(lab_error)?;
    let engine = match engine_args {
        Some(json) => MockerArgs::from_json(json).map_err(|e| PyValueError::new_err(format!("engine_args: {e}")))?,
        None => MockerArgs::default(),
    };
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
    };
    config.validate().map_err(lab_error)?;
    let report = py.detach(|| lab::read_trace(&trace_path).and_then(|trace| lab::run(&trace, policy, &config))).map_err(lab_error)?;
    let d = PyDict::new(py);
    d.set_item("policy", report.policy.as_str())?;
    d.set_item("requests", report.requests)?;
    d.set_item("completed", report.completed)?;
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
    m.add_function(wrap_pyfunction!(run_routing_lab, m)?)?;
    Ok(())
}

//! The KV router's index and protocol for Python: `compute_block_hash_for_seq`,
//! `RadixTree`, `OverlapScores`, `KvIndexer` (follows a component's KV events),
//! `KvEventPublisher` and `WorkerMetricsPublisher` (what an engine publishes).
//! Index calls take microseconds, so they keep the GIL.

use std::collections::HashMap;

use dynamo_llm::kv_router::protocols::{
    block_id_from_signed, compute_block_hash_for_seq_salted, full_stored_blocks, ForwardPassMetrics, KvCacheEvent,
    KvCacheEventData, KvCacheRemoveData, KvCacheStoreData,
};
use dynamo_llm::kv_router::{self, RadixTree};
use parking_lot::Mutex;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList, PyString};
use pyo3::ffi;

use crate::bridge::{block_on, ready, tokio};
use crate::errors::to_py;
use crate::int_list;
use crate::runtime::PyComponent;

/// An engine's block id: engines may hand out signed 64-bit ids ([`block_id_from_signed`]).
fn block_id(obj: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(v) = obj.extract::<u64>() {
        return Ok(v);
    }
    obj.extract::<i64>()
        .map(block_id_from_signed)
        .map_err(|_| PyValueError::new_err(format!("a block hash must be a 64-bit integer, got {obj}")))
}

fn block_ids(objs: &[Bound<'_, PyAny>]) -> PyResult<Vec<u64>> {
    objs.iter().map(block_id).collect()
}

/// Token ids from a list (fast) or any sequence of ints.
fn token_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    match obj.cast::<PyList>() {
        Ok(list) => int_list::list_ints(list),
        Err(_) => obj.extract(),
    }
}

/// Block hashes from a list (fast) or any sequence of ints. From a list, each int is
/// taken modulo 2^64 (a negative one as its two's complement: [`block_id_from_signed`]'s
/// rule, for any int at once): hashes are full 64-bit values, which CPython stores in three digits, and
/// the checked conversion of those costs as much as the index lookup behind it.
fn hash_list(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
    let Ok(list) = obj.cast::<PyList>() else { return obj.extract() };
    let mut out = Vec::with_capacity(list.len());
    int_list::for_each_item(list, |item| {
        // SAFETY: `item` is a borrowed item of the list, alive while we hold the GIL; it is
        // checked to be an int first, so the conversion runs no `__index__`.
        unsafe {
            if ffi::PyLong_Check(item) == 0 {
                let item = Bound::from_borrowed_ptr(obj.py(), item);
                return Err(PyValueError::new_err(format!("a block hash must be an int, got {item:?}")));
            }
            out.push(ffi::PyLong_AsUnsignedLongLongMask(item));
        }
        Ok(())
    })?;
    Ok(out)
}

fn nonzero_block_size(block_size: usize) -> PyResult<usize> {
    if block_size == 0 {
        return Err(PyValueError::new_err("block_size must be at least 1"));
    }
    Ok(block_size)
}

/// The tokens hash of every full block of `tokens` (xxh3-64, seed 1337, over the block's
/// token ids as little-endian u32; salted when `lora_name` is given).
#[pyfunction]
#[pyo3(signature = (tokens, block_size, lora_name=None))]
fn compute_block_hash_for_seq(tokens: &Bound<'_, PyAny>, block_size: usize, lora_name: Option<&str>) -> PyResult<Vec<u64>> {
    let block_size = nonzero_block_size(block_size)?;
    Ok(compute_block_hash_for_seq_salted(&token_list(tokens)?, block_size, lora_name))
}

/// How many leading blocks of a request each worker holds.
#[pyclass(name = "OverlapScores", module = "dynamo._core", frozen)]
pub struct PyOverlapScores {
    scores: HashMap<u64, u32>,
}

#[pymethods]
impl PyOverlapScores {
    /// Worker id → matched blocks (workers matching none are absent).
    #[getter]
    fn scores(&self) -> HashMap<u64, u32> {
        self.scores.clone()
    }

    fn __repr__(&self) -> String {
        let mut s: Vec<_> = self.scores.iter().collect();
        s.sort_unstable();
        format!("OverlapScores({s:?})")
    }
}

impl From<kv_router::OverlapScores> for PyOverlapScores {
    fn from(o: kv_router::OverlapScores) -> Self {
        PyOverlapScores { scores: o.scores }
    }
}

fn event_bytes<'a>(event: &'a Bound<'_, PyAny>) -> PyResult<&'a [u8]> {
    if let Ok(b) = event.cast::<PyBytes>() {
        return Ok(b.as_bytes());
    }
    if let Ok(s) = event.cast::<PyString>() {
        return Ok(s.to_str()?.as_bytes());
    }
    Err(PyValueError::new_err("a KV event must be JSON as bytes or str"))
}

fn stats_dict(stats: kv_router::IndexStats) -> HashMap<&'static str, u64> {
    HashMap::from([
        ("events", stats.events),
        ("unknown_parents", stats.unknown_parents),
        ("unknown_removals", stats.unknown_removals),
        ("event_id_gaps", stats.event_id_gaps),
        ("expired", stats.expired),
    ])
}

fn dump_json(tree: &RadixTree) -> PyResult<Vec<String>> {
    tree.dump()
        .iter()
        .map(|e| serde_json::to_string(e).map_err(|e| PyValueError::new_err(format!("cannot encode an event: {e}"))))
        .collect()
}

/// The fleet's KV cache index, fed by hand with KV events.
#[pyclass(name = "RadixTree", module = "dynamo._core", frozen)]
pub struct PyRadixTree {
    tree: Mutex<RadixTree>,
}

#[pymethods]
impl PyRadixTree {
    #[new]
    fn new() -> Self {
        PyRadixTree { tree: Mutex::new(RadixTree::new()) }
    }

    /// Apply one KV event of `worker_id`, JSON like
    /// `{"event_id": 7, "data": {"stored": {"parent_hash": null, "blocks": [...]}}}`.
    fn apply_event(&self, worker_id: u64, event: &Bound<'_, PyAny>) -> PyResult<()> {
        let event: KvCacheEvent = serde_json::from_slice(event_bytes(event)?)
            .map_err(|e| PyValueError::new_err(format!("invalid KV event: {e}")))?;
        self.tree.lock().apply_event(worker_id, &event);
        Ok(())
    }

    /// Leading blocks (by tokens hash, as `compute_block_hash_for_seq` gives) each worker holds.
    fn find_matches(&self, hashes: &Bound<'_, PyAny>) -> PyResult<PyOverlapScores> {
        let hashes = hash_list(hashes)?;
        Ok(self.tree.lock().find_matches(&hashes).into())
    }

    /// Forget a worker.
    fn remove_worker(&self, worker_id: u64) {
        self.tree.lock().remove_worker(worker_id);
    }

    /// The index as `stored` events (JSON strings `{"worker_id": ..., "event": {...}}`),
    /// parents first: applied in order to an empty tree they rebuild it.
    fn dump_tree_as_events(&self) -> PyResult<Vec<String>> {
        dump_json(&self.tree.lock())
    }

    /// Counters: events, unknown_parents, unknown_removals, event_id_gaps, expired.
    fn stats(&self) -> HashMap<&'static str, u64> {
        stats_dict(self.tree.lock().stats())
    }
}

/// A `RadixTree` following the KV events of a component's workers.
#[pyclass(name = "KvIndexer", module = "dynamo._core", frozen)]
pub struct PyKvIndexer {
    inner: kv_router::KvIndexer,
}

#[pymethods]
impl PyKvIndexer {
    #[new]
    fn new(py: Python<'_>, component: &PyComponent, kv_block_size: usize) -> PyResult<Self> {
        let block_size = nonzero_block_size(kv_block_size)?;
        let component = component.inner.clone();
        let inner = block_on(py, kv_router::KvIndexer::new(component, block_size)).map_err(to_py)?;
        Ok(PyKvIndexer { inner })
    }

    /// Tokens per block.
    fn block_size(&self) -> usize {
        self.inner.block_size()
    }

    /// Awaitable: leading full blocks of `token_ids` each worker holds.
    #[pyo3(signature = (token_ids, lora_name=None))]
    fn find_matches_for_request(
        &self,
        py: Python<'_>,
        token_ids: &Bound<'_, PyAny>,
        lora_name: Option<&str>,
    ) -> PyResult<Py<PyAny>> {
        let scores = PyOverlapScores::from(self.inner.find_matches_for_request(&token_list(token_ids)?, lora_name));
        ready(py, Ok(Py::new(py, scores)?.into_any()))
    }

    /// Leading blocks (by tokens hash) each worker holds.
    fn find_matches(&self, hashes: &Bound<'_, PyAny>) -> PyResult<PyOverlapScores> {
        Ok(self.inner.find_matches(&hash_list(hashes)?).into())
    }

    /// Forget a worker (workers that leave discovery are forgotten by themselves).
    fn remove_worker(&self, worker_id: u64) {
        self.inner.tree().lock().remove_worker(worker_id);
    }

    /// The workers (ascending) its last look at discovery found; it forgets a worker
    /// only once it saw it listed.
    fn listed_workers(&self) -> Vec<u64> {
        self.inner.listed_workers()
    }

    /// The index as `stored` events (JSON strings), parents first.
    fn dump_tree_as_events(&self) -> PyResult<Vec<String>> {
        dump_json(&self.inner.tree().lock())
    }

    /// Counters: events, unknown_parents, unknown_removals, event_id_gaps, expired.
    fn stats(&self) -> HashMap<&'static str, u64> {
        stats_dict(self.inner.tree().lock().stats())
    }
}

/// An engine's KV events, published on its component's `kv_events` subject. The
/// `publish_*` calls never block: events are queued for a background task.
#[pyclass(name = "KvEventPublisher", module = "dynamo._core", frozen)]
pub struct PyKvEventPublisher {
    inner: kv_router::KvEventPublisher,
    block_size: usize,
}

impl PyKvEventPublisher {
    fn send(&self, event_id: u64, data: KvCacheEventData) -> bool {
        self.inner.publish(KvCacheEvent { event_id, data })
    }
}

#[pymethods]
impl PyKvEventPublisher {
    #[new]
    #[pyo3(signature = (component, worker_id=None, kv_block_size=16))]
    fn new(component: &PyComponent, worker_id: Option<u64>, kv_block_size: usize) -> PyResult<Self> {
        let block_size = nonzero_block_size(kv_block_size)?;
        let worker_id = worker_id.unwrap_or_else(|| component.inner.planes().instance_id());
        let _guard = tokio().enter();
        Ok(PyKvEventPublisher { inner: kv_router::KvEventPublisher::new(component.inner.clone(), worker_id), block_size })
    }

    /// The worker id the events carry (by default the process's instance id).
    #[getter]
    fn worker_id(&self) -> u64 {
        self.inner.worker_id()
    }

    /// Blocks stored: `token_ids` split by `num_block_tokens` (tokens per block), with the
    /// engine's ids `block_hashes`; the first block follows `parent_hash` (the engine's id
    /// of the block before, `None` at the start of a sequence). Only full blocks count:
    /// the first one shorter than the block size ends the event. Returns False when the
    /// queue was full and the event was dropped.
    #[pyo3(signature = (event_id, token_ids, num_block_tokens, block_hashes, lora_name=None, parent_hash=None))]
    fn publish_stored(
        &self,
        event_id: u64,
        token_ids: Vec<u32>,
        num_block_tokens: Vec<usize>,
        block_hashes: Vec<Bound<'_, PyAny>>,
        lora_name: Option<&str>,
        parent_hash: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let ids = block_ids(&block_hashes)?;
        let parent_hash = parent_hash.as_ref().map(block_id).transpose()?;
        let blocks = full_stored_blocks(&token_ids, &num_block_tokens, &ids, self.block_size, lora_name)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(self.send(event_id, KvCacheEventData::Stored(KvCacheStoreData { parent_hash, blocks })))
    }

    /// Blocks evicted (the engine's ids).
    fn publish_removed(&self, event_id: u64, block_hashes: Vec<Bound<'_, PyAny>>) -> PyResult<bool> {
        let block_hashes = block_ids(&block_hashes)?;
        Ok(self.send(event_id, KvCacheEventData::Removed(KvCacheRemoveData { block_hashes })))
    }

    /// Everything evicted.
    fn publish_cleared(&self, event_id: u64) -> bool {
        self.send(event_id, KvCacheEventData::Cleared)
    }
}

/// An engine's load, published on its component's `load_metrics` subject when it
/// changes (at most every 100 ms) and at least every second.
#[pyclass(name = "WorkerMetricsPublisher", module = "dynamo._core", frozen)]
pub struct PyWorkerMetricsPublisher {
    inner: kv_router::WorkerMetricsPublisher,
    worker_id: u64,
}

#[pymethods]
impl PyWorkerMetricsPublisher {
    #[new]
    #[pyo3(signature = (component, worker_id=None))]
    fn new(component: &PyComponent, worker_id: Option<u64>) -> Self {
        let worker_id = worker_id.unwrap_or_else(|| component.inner.planes().instance_id());
        let _guard = tokio().enter();
        let inner = kv_router::WorkerMetricsPublisher::new(component.inner.clone(), worker_id, ForwardPassMetrics::default());
        PyWorkerMetricsPublisher { inner, worker_id }
    }

    /// The worker id the metrics carry (by default the process's instance id).
    #[getter]
    fn worker_id(&self) -> u64 {
        self.worker_id
    }

    /// Replace the published load.
    #[pyo3(signature = (request_active_slots, request_total_slots, kv_active_blocks, kv_total_blocks, num_requests_waiting, gpu_cache_usage_perc, gpu_prefix_cache_hit_rate, data_parallel_rank=None))]
    #[allow(clippy::too_many_arguments)]
    fn publish(
        &self,
        request_active_slots: u64,
        request_total_slots: u64,
        kv_active_blocks: u64,
        kv_total_blocks: u64,
        num_requests_waiting: u64,
        gpu_cache_usage_perc: f32,
        gpu_prefix_cache_hit_rate: f32,
        data_parallel_rank: Option<u32>,
    ) {
        self.inner.publish(ForwardPassMetrics {
            data_parallel_rank,
            request_active_slots,
            request_total_slots,
            kv_active_blocks,
            kv_total_blocks,
            num_requests_waiting,
            gpu_cache_usage_perc,
            gpu_prefix_cache_hit_rate,
        });
    }
}

/// Add this module's classes and functions to `m`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(compute_block_hash_for_seq, m)?)?;
    m.add_class::<PyOverlapScores>()?;
    m.add_class::<PyRadixTree>()?;
    m.add_class::<PyKvIndexer>()?;
    m.add_class::<PyKvEventPublisher>()?;
    m.add_class::<PyWorkerMetricsPublisher>()?;
    Ok(())
}

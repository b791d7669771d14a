//! Load metrics of a worker, as the KV router's cost function reads them (JSON on the
//! component's `load_metrics` subject, with the worker id beside the fields).

use serde::{Deserialize, Serialize};

/// A worker's load after a forward pass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ForwardPassMetrics {
    /// Data-parallel rank of the worker, if any.
    pub data_parallel_rank: Option<u32>,
    /// Sequences running.
    pub request_active_slots: u64,
    /// Most sequences that may run.
    pub request_total_slots: u64,
    /// KV blocks in use by running sequences.
    pub kv_active_blocks: u64,
    /// KV blocks in all.
    pub kv_total_blocks: u64,
    /// Requests queued, not yet running.
    pub num_requests_waiting: u64,
    /// `kv_active_blocks / kv_total_blocks`, 0–1.
    pub gpu_cache_usage_perc: f32,
    /// Share of looked-up prompt blocks found in the prefix cache since start, 0–1.
    pub gpu_prefix_cache_hit_rate: f32,
}

/// The published form: `{"worker_id": 7, "data_parallel_rank": null, ...}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadMetricsEvent {
    /// The instance id of the worker's endpoint.
    pub worker_id: u64,
    /// The metrics, flattened beside `worker_id`.
    #[serde(flatten)]
    pub metrics: ForwardPassMetrics,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_metrics_json_is_flat() {
        let event = LoadMetricsEvent {
            worker_id: 3,
            metrics: ForwardPassMetrics { request_total_slots: 8, kv_total_blocks: 100, ..Default::default() },
        };
        let value = serde_json::to_value(&event).unwrap();
        let expected = serde_json::json!({
            "worker_id": 3, "data_parallel_rank": null, "request_active_slots": 0,
            "request_total_slots": 8, "kv_active_blocks": 0, "kv_total_blocks": 100,
            "num_requests_waiting": 0, "gpu_cache_usage_perc": 0.0, "gpu_prefix_cache_hit_rate": 0.0
        });
        assert_eq!(value, expected);
        assert_eq!(serde_json::from_value::<LoadMetricsEvent>(value).unwrap(), event);
    }
}

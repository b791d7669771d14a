//! Per-endpoint statistics (requests, errors, in-flight, latency), kept in a Prometheus
//! registry that the system server exposes at `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

use crate::error::{Error, ErrorKind, Result};

const LABELS: [&str; 3] = ["namespace", "component", "endpoint"];

/// The runtime's metric families.
pub struct MetricsRegistry {
    registry: Registry,
    requests: IntCounterVec,
    errors: IntCounterVec,
    inflight: IntGaugeVec,
    duration: HistogramVec,
}

fn prom(e: prometheus::Error) -> Error {
    Error::new(ErrorKind::Config, format!("metrics registry: {e}"))
}

impl MetricsRegistry {
    /// Create the families.
    pub fn new() -> Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("dynamo_endpoint_requests_total", "Requests received by an endpoint"),
            &LABELS,
        )
        .map_err(prom)?;
        let errors = IntCounterVec::new(
            Opts::new("dynamo_endpoint_errors_total", "Requests that ended with an error"),
            &LABELS,
        )
        .map_err(prom)?;
        let inflight = IntGaugeVec::new(
            Opts::new("dynamo_endpoint_inflight_requests", "Requests being served now"),
            &LABELS,
        )
        .map_err(prom)?;
        let duration = HistogramVec::new(
            HistogramOpts::new("dynamo_endpoint_request_duration_seconds", "Time from request to end of stream")
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]),
            &LABELS,
        )
        .map_err(prom)?;
        for c in [Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>, Box::new(errors.clone()), Box::new(inflight.clone()), Box::new(duration.clone())] {
            registry.register(c).map_err(prom)?;
        }
        Ok(MetricsRegistry { registry, requests, errors, inflight, duration })
    }

    /// The handle an endpoint updates.
    pub fn endpoint(&self, namespace: &str, component: &str, endpoint: &str) -> Arc<EndpointMetrics> {
        let labels = [namespace, component, endpoint];
        Arc::new(EndpointMetrics {
            requests: self.requests.with_label_values(&labels),
            errors: self.errors.with_label_values(&labels),
            inflight: self.inflight.with_label_values(&labels),
            duration: self.duration.with_label_values(&labels),
            inflight_now: AtomicU64::new(0),
        })
    }

    /// Add a metric family of another crate (e.g. dynamo-llm's disaggregation
    /// counters) so that `/metrics` shows it.
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) -> Result<()> {
        self.registry.register(collector).map_err(prom)
    }

    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        out
    }
}

/// Counters of one endpoint.
pub struct EndpointMetrics {
    requests: prometheus::IntCounter,
    errors: prometheus::IntCounter,
    inflight: prometheus::IntGauge,
    duration: prometheus::Histogram,
    inflight_now: AtomicU64,
}

/// A point-in-time copy of an endpoint's counters.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct EndpointStats {
    /// Requests received.
    pub requests: u64,
    /// Requests that ended with an error.
    pub errors: u64,
    /// Requests being served now.
    pub inflight: u64,
    /// Sum of request durations in seconds.
    pub duration_sum_seconds: f64,
}

impl EndpointMetrics {
    pub(crate) fn request_started(&self) {
        self.requests.inc();
        self.inflight.inc();
        self.inflight_now.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn request_failed(&self) {
        self.errors.inc();
    }

    pub(crate) fn request_finished(&self, elapsed: Duration) {
        self.inflight.dec();
        self.inflight_now.fetch_sub(1, Ordering::AcqRel);
        self.duration.observe(elapsed.as_secs_f64());
    }

    /// Requests being served now.
    pub fn inflight(&self) -> u64 {
        self.inflight_now.load(Ordering::Acquire)
    }

    /// A copy of the counters.
    pub fn stats(&self) -> EndpointStats {
        EndpointStats {
            requests: self.requests.get(),
            errors: self.errors.get(),
            inflight: self.inflight(),
            duration_sum_seconds: self.duration.get_sample_sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_renders() {
        let reg = MetricsRegistry::new().unwrap();
        let m = reg.endpoint("ns", "comp", "generate");
        m.request_started();
        m.request_started();
        m.request_failed();
        m.request_finished(Duration::from_millis(3));
        let s = m.stats();
        assert_eq!((s.requests, s.errors, s.inflight), (2, 1, 1));
        let text = reg.render();
        assert!(text.contains(r#"dynamo_endpoint_requests_total{component="comp",endpoint="generate",namespace="ns"} 2"#), "{text}");
        assert!(text.contains("dynamo_endpoint_inflight_requests"), "{text}");
    }
}

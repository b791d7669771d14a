//! Counters of disaggregated serving, exposed at the system server's `/metrics`:
//! `dynamo_disagg_prefills_total{source="remote|local|fallback"}` on decode workers
//! (fallback: sent to a prefill worker, which failed or timed out, then done locally)
//! and `dynamo_disagg_prefill_jobs_total{outcome="done|failed|expired"}` on prefill workers.

use prometheus::{IntCounter, IntCounterVec, Opts};

/// Where a decode worker's prefill ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillSource {
    /// On a prefill worker; the KV was received.
    Remote,
    /// Here, by the decision rule (or no prefill worker was up).
    Local,
    /// Here, after a remote attempt failed or timed out.
    Fallback,
}

/// The counters of one worker.
#[derive(Debug, Clone)]
pub struct DisaggMetrics {
    remote: IntCounter,
    local: IntCounter,
    fallback: IntCounter,
    jobs: IntCounterVec,
}

impl DisaggMetrics {
    /// Create the counters and register them with the runtime's registry.
    pub fn register(runtime: &dynamo_runtime::Planes) -> dynamo_runtime::Result<Self> {
        let prefills = IntCounterVec::new(
            Opts::new("dynamo_disagg_prefills_total", "Prefills of a decode worker's requests, by where they ran"),
            &["source"],
        )
        .map_err(config_error)?;
        let jobs = IntCounterVec::new(
            Opts::new("dynamo_disagg_prefill_jobs_total", "Prefill jobs a prefill worker took, by outcome"),
            &["outcome"],
        )
        .map_err(config_error)?;
        runtime.metrics().register(Box::new(prefills.clone()))?;
        runtime.metrics().register(Box::new(jobs.clone()))?;
        Ok(DisaggMetrics {
            remote: prefills.with_label_values(&["remote"]),
            local: prefills.with_label_values(&["local"]),
            fallback: prefills.with_label_values(&["fallback"]),
            jobs,
        })
    }

    /// Count a decode worker's prefill.
    pub fn prefill(&self, source: PrefillSource) {
        match source {
            PrefillSource::Remote => self.remote.inc(),
            PrefillSource::Local => self.local.inc(),
            PrefillSource::Fallback => self.fallback.inc(),
        }
    }

    /// Prefills so far from `source`.
    pub fn prefills(&self, source: PrefillSource) -> u64 {
        match source {
            PrefillSource::Remote => self.remote.get(),
            PrefillSource::Local => self.local.get(),
            PrefillSource::Fallback => self.fallback.get(),
        }
    }

    /// Count a prefill worker's job (`done`, `failed`, `expired`).
    pub(crate) fn job(&self, outcome: &str) {
        self.jobs.with_label_values(&[outcome]).inc();
    }
}

fn config_error(e: prometheus::Error) -> dynamo_runtime::Error {
    dynamo_runtime::Error::new(dynamo_runtime::ErrorKind::Config, format!("disagg metrics: {e}"))
}

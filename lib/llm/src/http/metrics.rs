//! The frontend's Prometheus metrics (`GET /metrics`), in a registry the service owns:
//! request counts by outcome, in-flight requests, and latency and token histograms.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use prometheus::{Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

use crate::model_manager::EngineKind;

/// Metric names start with this.
pub const METRICS_PREFIX: &str = "dynamo_frontend";

/// The frontend's metric families.
pub struct HttpMetrics {
    registry: Registry,
    requests: IntCounterVec,
    responses: IntCounterVec,
    inflight: IntGaugeVec,
    duration: HistogramVec,
    ttft: HistogramVec,
    itl: HistogramVec,
    isl: HistogramVec,
    osl: HistogramVec,
    /// Each model's series, resolved once (a label lookup hashes and locks; a request
    /// would otherwise do one per observation).
    models: RwLock<HashMap<String, Arc<ModelSeries>>>,
}

/// One model's series of the per-model families.
struct ModelSeries {
    inflight: IntGauge,
    duration: Histogram,
    ttft: Histogram,
    itl: Histogram,
    isl: Histogram,
    osl: Histogram,
}

impl std::fmt::Debug for HttpMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HttpMetrics")
    }
}

fn histogram(name: &str, help: &str, buckets: Vec<f64>) -> prometheus::Result<HistogramVec> {
    HistogramVec::new(HistogramOpts::new(format!("{METRICS_PREFIX}_{name}"), help).buckets(buckets), &["model"])
}

impl HttpMetrics {
    /// Create the families in a fresh registry.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(format!("{METRICS_PREFIX}_requests_total"), "Requests by model, route, streaming and outcome"),
            &["model", "endpoint", "request_type", "status"],
        )?;
        let responses = IntCounterVec::new(
            Opts::new(format!("{METRICS_PREFIX}_responses_total"), "HTTP responses by route and status code"),
            &["endpoint", "status"],
        )?;
        let inflight = IntGaugeVec::new(
            Opts::new(format!("{METRICS_PREFIX}_inflight_requests"), "Requests being served now"),
            &["model"],
        )?;
        let seconds = prometheus::exponential_buckets(0.001, 2.0, 19)?; // 1 ms .. 262 s
        let duration = histogram("request_duration_seconds", "Time from request to the end of the response", seconds.clone())?;
        let ttft = histogram("time_to_first_token_seconds", "Time from request to the first item", seconds)?;
        let itl = histogram(
            "inter_token_latency_seconds",
            "Time between items divided by the tokens they carry",
            prometheus::exponential_buckets(0.0001, 2.0, 16)?,
        )?;
        let tokens = prometheus::exponential_buckets(1.0, 2.0, 18)?; // 1 .. 131072
        let isl = histogram("input_sequence_tokens", "Prompt tokens per request", tokens.clone())?;
        let osl = histogram("output_sequence_tokens", "Generated tokens per request", tokens)?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(responses.clone()))?;
        registry.register(Box::new(inflight.clone()))?;
        for h in [&duration, &ttft, &itl, &isl, &osl] {
            registry.register(Box::new(h.clone()))?;
        }
        let models = RwLock::new(HashMap::new());
        Ok(HttpMetrics { registry, requests, responses, inflight, duration, ttft, itl, isl, osl, models })
    }

    /// `model`'s series, created on first use.
    fn series(&self, model: &str) -> Arc<ModelSeries> {
        if let Some(series) = self.models.read().unwrap_or_else(|e| e.into_inner()).get(model) {
            return series.clone();
        }
        let mut models = self.models.write().unwrap_or_else(|e| e.into_inner());
        models
            .entry(model.to_string())
            .or_insert_with(|| {
                let label = [model];
                Arc::new(ModelSeries {
                    inflight: self.inflight.with_label_values(&label),
                    duration: self.duration.with_label_values(&label),
                    ttft: self.ttft.with_label_values(&label),
                    itl: self.itl.with_label_values(&label),
                    isl: self.isl.with_label_values(&label),
                    osl: self.osl.with_label_values(&label),
                })
            })
            .clone()
    }

    /// The registry, for callers that add their own families.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every metric in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus::TextEncoder::new().encode_utf8(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "could not encode metrics");
        }
        out
    }

    /// Count one HTTP response of `endpoint` (the route's path) with `status`.
    pub(crate) fn response(&self, endpoint: &str, status: axum::http::StatusCode) {
        self.responses.with_label_values(&[endpoint, status.as_str()]).inc();
    }

    /// Start tracking one request; it counts as an error unless
    /// [`RequestMetrics::succeeded`] is called before it is dropped.
    /// Its log line (at info, when it ends) carries `request_id`.
    pub(crate) fn start(self: &Arc<Self>, request_id: &str, model: &str, route: EngineKind, streaming: bool) -> RequestMetrics {
        let series = self.series(model);
        series.inflight.inc();
        RequestMetrics {
            metrics: self.clone(),
            series,
            request_id: request_id.to_string(),
            model: model.to_string(),
            route,
            streaming,
            started: Instant::now(),
            last_item: None,
            ttft: None,
            prompt_tokens: None,
            output_tokens: 0,
            success: false,
        }
    }
}

/// One request's measurements, recorded when dropped.
pub(crate) struct RequestMetrics {
    metrics: Arc<HttpMetrics>,
    series: Arc<ModelSeries>,
    request_id: String,
    model: String,
    route: EngineKind,
    streaming: bool,
    started: Instant,
    last_item: Option<Instant>,
    ttft: Option<std::time::Duration>,
    prompt_tokens: Option<u32>,
    output_tokens: u64,
    success: bool,
}

impl RequestMetrics {
    /// An item arrived carrying these token counts.
    pub(crate) fn item(&mut self, prompt_tokens: Option<u32>, completion_tokens: u32) {
        let now = Instant::now();
        match self.last_item {
            None => {
                let ttft = now - self.started;
                self.ttft = Some(ttft);
                self.series.ttft.observe(ttft.as_secs_f64());
            }
            Some(last) if completion_tokens > 0 => {
                let per_token = (now - last).as_secs_f64() / f64::from(completion_tokens);
                self.series.itl.observe(per_token);
            }
            Some(_) => {}
        }
        self.last_item = Some(now);
        if let (Some(prompt), None) = (prompt_tokens, self.prompt_tokens) {
            self.prompt_tokens = Some(prompt);
            self.series.isl.observe(f64::from(prompt));
        }
        self.output_tokens += u64::from(completion_tokens);
    }

    /// The response completed.
    pub(crate) fn succeeded(&mut self) {
        self.success = true;
    }
}

impl Drop for RequestMetrics {
    fn drop(&mut self) {
        let m = &self.metrics;
        self.series.inflight.dec();
        let request_type = if self.streaming { "stream" } else { "unary" };
        let status = if self.success { "success" } else { "error" };
        m.requests.with_label_values(&[self.model.as_str(), self.route.as_str(), request_type, status]).inc();
        let duration = self.started.elapsed();
        self.series.duration.observe(duration.as_secs_f64());
        if self.last_item.is_some() {
            self.series.osl.observe(self.output_tokens as f64);
        }
        tracing::info!(
            request_id = %self.request_id,
            model = %self.model,
            endpoint = self.route.as_str(),
            request_type,
            status,
            tokens_in = self.prompt_tokens.unwrap_or(0),
            tokens_out = self.output_tokens,
            ttft_ms = self.ttft.map(|t| t.as_secs_f64() * 1000.0),
            duration_ms = duration.as_secs_f64() * 1000.0,
            "request"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_counted_once_with_its_outcome() {
        let metrics = Arc::new(HttpMetrics::new().unwrap());
        {
            let mut r = metrics.start("r1", "m", EngineKind::Chat, true);
            r.item(Some(7), 1);
            r.item(None, 2);
            assert!(metrics.render().contains("dynamo_frontend_inflight_requests{model=\"m\"} 1"));
            r.succeeded();
        }
        drop(metrics.start("r2", "m", EngineKind::Completions, false));
        metrics.response("/v1/chat/completions", axum::http::StatusCode::BAD_REQUEST);
        let text = metrics.render();
        assert!(text.contains(r#"dynamo_frontend_responses_total{endpoint="/v1/chat/completions",status="400"} 1"#), "{text}");
        assert!(text.contains(r#"dynamo_frontend_requests_total{endpoint="chat_completions",model="m",request_type="stream",status="success"} 1"#), "{text}");
        assert!(text.contains(r#"dynamo_frontend_requests_total{endpoint="completions",model="m",request_type="unary",status="error"} 1"#), "{text}");
        assert!(text.contains("dynamo_frontend_inflight_requests{model=\"m\"} 0"));
        assert!(text.contains("dynamo_frontend_input_sequence_tokens_sum{model=\"m\"} 7"), "{text}");
        assert!(text.contains("dynamo_frontend_output_sequence_tokens_sum{model=\"m\"} 3"), "{text}");
        assert!(text.contains("dynamo_frontend_inter_token_latency_seconds_count{model=\"m\"} 1"), "{text}");
    }
}

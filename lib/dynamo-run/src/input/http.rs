//! `in=http`: the OpenAI-compatible HTTP service in front of the local engine or the
//! discovered models, until SIGINT/SIGTERM; then a graceful shutdown: `/ready` answers
//! 503, no new connection is accepted, and in-flight responses get
//! `DYN_SHUTDOWN_TIMEOUT` (30 s) to finish.

use std::sync::Arc;

use dynamo_llm::http::{responses, HttpService};
use tokio_util::sync::CancellationToken;

use crate::error::RunError;
use crate::flags::RunConfig;
use crate::models::Models;
use crate::output;

/// Serve HTTP until `cancel` fires.
pub async fn run(config: &RunConfig, cancel: CancellationToken) -> Result<(), RunError> {
    let models = Models::start(config).await?;
    let result = serve(config, &models, cancel).await;
    models.shutdown().await;
    result
}

async fn serve(config: &RunConfig, models: &Models, cancel: CancellationToken) -> Result<(), RunError> {
    let drain_timeout = dynamo_runtime::RuntimeConfig::from_env()?.shutdown_timeout;
    let mut builder = HttpService::builder()
        .drain_timeout(drain_timeout)
        .host(config.http_host.clone())
        .port(config.http_port)
        .manager(models.manager.clone())
        .limits(config.http_limits.clone())
        .cors_origins(config.cors_origins.clone())
        .streams(config.streams.clone());
    let responses = &config.responses;
    let store = match models.runtime() {
        Some(runtime) if responses.in_discovery => {
            responses::discovery_store(runtime.planes().discovery().clone(), responses.ttl, responses.max)
        }
        _ => responses::memory_store(responses.max, responses.ttl),
    };
    builder = builder.responses_store(store);
    if let Some(key) = &config.api_key {
        builder = builder.api_key(key.clone());
    }
    if let Some(runtime) = models.runtime() {
        // Discovery, the planes, and the runtime itself: /health is 503 when any is down.
        // Resumable streams are announced in discovery, so any frontend can resume them;
        // other frontends reach this one at the runtime's advertised host.
        let directory = dynamo_llm::http::streams::DiscoveryDirectory::new(runtime.planes().discovery().clone());
        builder = builder.stream_directory(Arc::new(directory));
        if matches!(config.http_host.as_str(), "0.0.0.0" | "::") {
            builder = builder.advertise_host(runtime.planes().config().resolved_tcp_host());
        }
        let runtime = runtime.clone();
        builder = builder.health_check(Arc::new(move || runtime.health()));
    }
    let service = builder.build()?;
    let bound = service.bind().await?;
    if let Some(runtime) = models.runtime() {
        // A frontend registers no endpoint: it vouches for itself once it listens, so
        // its system server's `/ready` (DYN_SYSTEM_ENABLED) follows the HTTP service.
        runtime.set_ready(true);
    }
    let auth = if config.api_key.is_some() { "; API key required" } else { "" };
    output::status(&format!("serving http on {} ({}{auth})", bound.local_addr(), models.describe()));
    bound.serve(cancel).await?;
    Ok(())
}

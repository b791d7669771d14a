//! `in=http`: the OpenAI-compatible HTTP service in front of the local engine or the
//! discovered models, until SIGINT/SIGTERM; then a graceful shutdown.

use dynamo_llm::http::HttpService;
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
    let service = HttpService::builder()
        .host(config.http_host.clone())
        .port(config.http_port)
        .manager(models.manager.clone())
        .build()?;
    let bound = service.bind().await?;
    output::status(&format!("serving http on {} ({})", bound.local_addr(), models.describe()));
    bound.serve(cancel).await?;
    Ok(())
}

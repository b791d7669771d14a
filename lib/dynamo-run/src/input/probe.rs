//! The engine check behind a worker's readiness: a one-token request to the local
//! engine, answered within a bound, before `in=dyn://` gives the runtime's readiness mark
//! (so `/ready` says 200 only for an engine that answers).

use std::time::Duration;

use dynamo_llm::engine::EngineError;
use dynamo_llm::protocols::common::{PreprocessedRequest, StopConditions};
use dynamo_runtime::RequestContext;
use futures::StreamExt;

use super::{chat_request, message};
use crate::error::RunError;
use crate::local::LocalEngine;

/// Bound on the engine's first answer.
const PROBE_BOUND: Duration = Duration::from_secs(60);

/// Send one one-token request to `engine` and wait for its first item (bounded).
pub(crate) async fn engine_answers(engine: &LocalEngine, model: &str) -> Result<(), RunError> {
    let ctx = RequestContext::new("readiness-probe");
    let first = async {
        let item = match engine {
            LocalEngine::Tokens(engine) => {
                let request = PreprocessedRequest {
                    token_ids: vec![1],
                    stop_conditions: StopConditions { max_tokens: Some(1), ..Default::default() },
                    ..Default::default()
                };
                let mut stream = engine.generate(request, ctx.clone()).await?;
                stream.next().await.map(|item| item.map(|_| ()))
            }
            LocalEngine::OpenAI(engine) => {
                let request = chat_request(model, vec![message("user", "ready?".to_string())], Some(1));
                let mut stream = engine.chat(request, ctx.clone()).await?;
                stream.next().await.map(|item| item.map(|_| ()))
            }
        };
        item.unwrap_or_else(|| Err(EngineError::Internal("the engine ended the probe's stream without an item".to_string())))
    };
    let answered = tokio::time::timeout(PROBE_BOUND, first).await;
    ctx.kill();
    match answered {
        Ok(result) => result.map_err(RunError::from),
        Err(_) => Err(RunError::Engine(EngineError::Timeout(format!("the engine did not answer a one-token request within {PROBE_BOUND:?}")))),
    }
}

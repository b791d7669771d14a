//! The worker side of a model: serve an OpenAI engine or a token engine on an
//! endpoint, in the wire format of [`super::wire`].

use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use serde::Serialize;

use dynamo_runtime::typed::stream_handler;
use dynamo_runtime::{Endpoint, RequestHandler};

use super::wire::{encode_error, OpenAIWireItem};
use crate::engine::{EngineError, OpenAIEngine, RequestContext, TokenEngine};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionChunk, ChatCompletionRequest, CompletionRequest, CompletionResponse};

/// An item of either OpenAI route, as sent.
#[derive(Serialize)]
#[serde(untagged)]
enum AnyOpenAIItem {
    Chat(OpenAIWireItem<ChatCompletionChunk>),
    Completion(OpenAIWireItem<CompletionResponse>),
}

type WireStream<T> = BoxStream<'static, Result<T, String>>;

/// Run `call`, then stream its items; an error (of the call or an item) ends the stream
/// with the encoded engine error.
fn drive<T, F>(call: F) -> WireStream<T>
where
    T: Send + 'static,
    F: std::future::Future<Output = Result<BoxStream<'static, Result<T, EngineError>>, EngineError>> + Send + 'static,
{
    futures::stream::once(call)
        .flat_map(|started| match started {
            Ok(stream) => stream,
            Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
        })
        .map(|item| item.map_err(|e| encode_error(&e)))
        .boxed()
}

fn openai_request(engine: Arc<dyn OpenAIEngine>, body: serde_json::Value, ctx: RequestContext) -> WireStream<AnyOpenAIItem> {
    drive(async move {
        if body.get("messages").is_some() {
            let request: ChatCompletionRequest =
                serde_json::from_value(body).map_err(|e| EngineError::BadRequest(format!("invalid chat request: {e}")))?;
            let stream = engine.chat(request, ctx).await?;
            Ok(stream.map(|item| item.map(|i| AnyOpenAIItem::Chat(i.into()))).boxed())
        } else {
            let request: CompletionRequest =
                serde_json::from_value(body).map_err(|e| EngineError::BadRequest(format!("invalid completion request: {e}")))?;
            let stream = engine.completion(request, ctx).await?;
            Ok(stream.map(|item| item.map(|i| AnyOpenAIItem::Completion(i.into()))).boxed())
        }
    })
}

/// A request handler running `engine` on OpenAI requests (chat when the body has
/// `messages`, else completions).
pub fn openai_engine_handler(engine: Arc<dyn OpenAIEngine>) -> Arc<dyn RequestHandler> {
    stream_handler(move |body: serde_json::Value, ctx: RequestContext| openai_request(engine.clone(), body, ctx))
}

/// A request handler running `engine` on `PreprocessedRequest`s.
pub fn token_engine_handler(engine: Arc<dyn TokenEngine>) -> Arc<dyn RequestHandler> {
    stream_handler(move |request: PreprocessedRequest, ctx: RequestContext| -> WireStream<LLMEngineOutput> {
        let engine = engine.clone();
        drive(async move { engine.generate(request, ctx).await })
    })
}

/// Serve `engine` on `endpoint` (OpenAI requests in, [`OpenAIWireItem`]s out). Returns
/// once the instance is discoverable; it serves until the runtime shuts down.
pub async fn serve_openai_engine(endpoint: &Endpoint, engine: Arc<dyn OpenAIEngine>) -> dynamo_runtime::Result<()> {
    endpoint.start(openai_engine_handler(engine)).await
}

/// Serve `engine` on `endpoint` (`PreprocessedRequest` in, `LLMEngineOutput` out).
/// Returns once the instance is discoverable; it serves until the runtime shuts down.
pub async fn serve_token_engine(endpoint: &Endpoint, engine: Arc<dyn TokenEngine>) -> dynamo_runtime::Result<()> {
    endpoint.start(token_engine_handler(engine)).await
}

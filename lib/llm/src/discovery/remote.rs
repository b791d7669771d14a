//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`].

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;

use dynamo_runtime::Client;

use super::linked_stream::LinkedStream;
use super::router_mode::RouterMode;
use super::wire::{decode_error, decode_openai_item};
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, OpenAIStream, RequestContext, TokenEngine, TokenStream,
};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

/// Send `request` as JSON and return the worker's item stream, linked to `ctx`.
async fn send(client: &Client, mode: RouterMode, request: &impl Serialize, ctx: &RequestContext) -> Result<LinkedStream, EngineError> {
    let body = serde_json::to_vec(request).map_err(|e| EngineError::Internal(format!("cannot serialize the request: {e}")))?;
    let stream = client.send(mode.to_runtime(), Bytes::from(body), Some(ctx.id().to_string())).await.map_err(decode_error)?;
    Ok(LinkedStream::new(stream, ctx))
}

/// The worker's items decoded as OpenAI chunks; annotation-only items are skipped.
fn openai_items<T: DeserializeOwned + Send + 'static>(stream: LinkedStream) -> OpenAIStream<T> {
    stream
        .filter_map(|item| async move {
            match item {
                Ok(item) if item.body.is_empty() => None,
                Ok(item) => Some(decode_openai_item::<T>(&item.body)),
                Err(e) => Some(Err(decode_error(e))),
            }
        })
        .boxed()
}

/// An OpenAI engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteOpenAIEngine {
    client: Client,
    mode: RouterMode,
}

impl RemoteOpenAIEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode`.
    pub fn new(client: Client, mode: RouterMode) -> Self {
        RemoteOpenAIEngine { client, mode }
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

#[async_trait]
impl OpenAIEngine for RemoteOpenAIEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        Ok(openai_items(send(&self.client, self.mode, &request, &ctx).await?))
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        Ok(openai_items(send(&self.client, self.mode, &request, &ctx).await?))
    }
}

/// A token engine served by workers of one endpoint.
#[derive(Debug, Clone)]
pub struct RemoteTokenEngine {
    client: Client,
    mode: RouterMode,
}

impl RemoteTokenEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode`.
    pub fn new(client: Client, mode: RouterMode) -> Self {
        RemoteTokenEngine { client, mode }
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

#[async_trait]
impl TokenEngine for RemoteTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let stream = send(&self.client, self.mode, &request, &ctx).await?;
        Ok(stream
            .filter_map(|item| async move {
                match item {
                    Ok(item) if item.body.is_empty() => None,
                    Ok(item) => Some(serde_json::from_slice::<LLMEngineOutput>(&item.body).map_err(|e| {
                        EngineError::Internal(format!("the worker sent an item that is not an LLMEngineOutput: {e}"))
                    })),
                    Err(e) => Some(Err(decode_error(e))),
                }
            })
            .boxed())
    }
}

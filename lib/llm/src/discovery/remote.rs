//! Engines that forward to a worker over the runtime's request plane: an OpenAI
//! engine (for `chat`/`completions` models) and a token engine (for `backend` models,
//! under the frontend's preprocessor). Formats are in [`super::wire`]. The token engine
//! may route with a [`KvRouter`] instead of the client's modes.

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::sync::Arc;

use dynamo_runtime::{Client, ErrorKind};

use super::linked_stream::LinkedStream;
use super::router_mode::RouterMode;
use super::wire::{decode_error, decode_openai_item};
use crate::kv_router::{GuardedStream, KvRouter};
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, OpenAIStream, RequestContext, TokenEngine, TokenStream,
};
use crate::protocols::common::{LLMEngineOutput, PreprocessedRequest};
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

/// Send `request` as JSON and return the worker's item stream, linked to `ctx`.
async fn send(client: &Client, mode: RouterMode, request: &impl Serialize, ctx: &RequestContext) -> Result<LinkedStream, EngineError> {
    send_with(client, mode.to_runtime(), request, ctx).await.map_err(decode_error)
}

/// Send `request` as JSON with the runtime's `mode`; the runtime's error as is.
async fn send_with(
    client: &Client,
    mode: dynamo_runtime::RouterMode,
    request: &impl Serialize,
    ctx: &RequestContext,
) -> Result<LinkedStream, dynamo_runtime::Error> {
    let body = serde_json::to_vec(request).map_err(|e| {
        dynamo_runtime::Error::new(ErrorKind::Serialization, format!("cannot serialize the request: {e}"))
    })?;
    let stream = client.send(mode, Bytes::from(body), Some(ctx.id().to_string())).await?;
    Ok(LinkedStream::new(stream, ctx))
}

/// Send `request` to the worker `router` picks among `client`'s instances. If that
/// instance is gone by the time of sending, it is dropped from the router's index and
/// the request goes round-robin instead (once). The returned stream counts as in
/// flight on the chosen worker until it ends or is dropped.
async fn send_kv(
    client: &Client,
    router: &KvRouter,
    mut request: PreprocessedRequest,
    ctx: &RequestContext,
) -> Result<TokenStream, EngineError> {
    let Some(decision) = router.route(&request.token_ids, &client.instance_ids()) else {
        // No instances: the client says so with the usual error.
        return Ok(token_items(send(client, RouterMode::RoundRobin, &request, ctx).await?));
    };
    request.estimated_prefix_hit_num_blocks = Some(u32::try_from(decision.overlap_blocks).unwrap_or(u32::MAX));
    let guard = router.start_request(decision.worker);
    match send_with(client, dynamo_runtime::RouterMode::Direct(decision.worker), &request, ctx).await {
        Ok(stream) => Ok(GuardedStream::new(token_items(stream), guard).boxed()),
        Err(e) if matches!(e.kind(), ErrorKind::NoInstances | ErrorKind::InstanceNotFound | ErrorKind::Unavailable) => {
            tracing::debug!(instance = %format_args!("{:x}", decision.worker), error = %e.full_message(), "kv-routed instance is gone; sending round-robin");
            drop(guard);
            router.remove_worker(decision.worker);
            request.estimated_prefix_hit_num_blocks = None;
            Ok(token_items(send(client, RouterMode::RoundRobin, &request, ctx).await?))
        }
        Err(e) => Err(decode_error(e)),
    }
}

/// The worker's items decoded as engine outputs; annotation-only items are skipped.
fn token_items(stream: LinkedStream) -> TokenStream {
    stream
        .filter_map(|item| async move {
            match item {
                Ok(item) if item.body.is_empty() => None,
                Ok(item) => Some(serde_json::from_slice::<LLMEngineOutput>(&item.body).map_err(|e| {
                    EngineError::Internal(format!("the worker sent an item that is not an LLMEngineOutput: {e}"))
                })),
                Err(e) => Some(Err(decode_error(e))),
            }
        })
        .boxed()
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
    kv: Option<Arc<KvRouter>>,
}

impl RemoteTokenEngine {
    /// Forward to the instances of `client`'s endpoint, picked by `mode` (`Kv` here is
    /// round-robin: use [`Self::with_kv_router`]).
    pub fn new(client: Client, mode: RouterMode) -> Self {
        RemoteTokenEngine { client, mode, kv: None }
    }

    /// Forward to the instances of `client`'s endpoint that `router` picks.
    pub fn with_kv_router(client: Client, router: Arc<KvRouter>) -> Self {
        RemoteTokenEngine { client, mode: RouterMode::Kv, kv: Some(router) }
    }

    /// The KV router, when it routes with one.
    pub fn kv_router(&self) -> Option<&Arc<KvRouter>> {
        self.kv.as_ref()
    }

    /// The client it sends with.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

#[async_trait]
impl TokenEngine for RemoteTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        match &self.kv {
            Some(router) => send_kv(&self.client, router, request, &ctx).await,
            None => Ok(token_items(send(&self.client, self.mode, &request, &ctx).await?)),
        }
    }
}

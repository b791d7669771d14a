//! A token engine served as an OpenAI engine: preprocess → token engine → detokenize
//! → OpenAI chunks.

use std::sync::Arc;

use async_trait::async_trait;
use futures::{future, StreamExt};

use crate::detokenizer::detokenize;
use crate::discovery::EngineFactory;
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext, StreamItem, TokenEngine, TokenStream,
};
use crate::model_card::{CardError, ModelDeploymentCard};
use crate::preprocessor::{Preprocessed, Preprocessor};
use crate::protocols::common::{FinishReason, LLMEngineOutput};
use crate::protocols::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, CompletionChoice, CompletionRequest,
    CompletionResponse,
};
use crate::protocols::unix_now;

/// Serves a [`TokenEngine`] for one model card as an [`OpenAIEngine`].
pub struct Pipeline {
    preprocessor: Arc<Preprocessor>,
    engine: Arc<dyn TokenEngine>,
}

impl Pipeline {
    /// Load the card's tokenizer and template once; fails if the card has no
    /// tokenizer or a broken template.
    pub fn new(card: Arc<ModelDeploymentCard>, engine: Arc<dyn TokenEngine>) -> Result<Self, CardError> {
        Ok(Pipeline { preprocessor: Arc::new(Preprocessor::new(card)?), engine })
    }

    /// A pipeline sharing an already built preprocessor (one per model card, however
    /// many engines serve it).
    pub fn with_preprocessor(preprocessor: Arc<Preprocessor>, engine: Arc<dyn TokenEngine>) -> Self {
        Pipeline { preprocessor, engine }
    }

    /// The [`EngineFactory`] a frontend's [`crate::discovery::ModelWatcher`] uses for
    /// `backend` models: a pipeline built from each fetched card (JSON).
    pub fn factory() -> EngineFactory {
        Arc::new(|card: serde_json::Value, engine: Arc<dyn TokenEngine>| {
            let card: ModelDeploymentCard =
                serde_json::from_value(card).map_err(|e| format!("invalid model card: {e}"))?;
            let pipeline = Pipeline::new(Arc::new(card), engine).map_err(|e| e.to_string())?;
            Ok(Arc::new(pipeline) as Arc<dyn OpenAIEngine>)
        })
    }

    /// The preprocessor (tokenizer, template) this pipeline uses.
    pub fn preprocessor(&self) -> &Arc<Preprocessor> {
        &self.preprocessor
    }

    /// Run the engine on a preprocessed request and detokenize its output.
    async fn generate(&self, pre: &Preprocessed, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let stream = self.engine.generate(pre.request.clone(), ctx.clone()).await?;
        Ok(detokenize(self.preprocessor.tokenizer(), &pre.request, stream, ctx))
    }
}

/// Turns detokenized steps into OpenAI items: steps with no text and no finish are
/// folded into the next item (their tokens still counted); the first item carries
/// the prompt token count.
struct ChunkAccounting {
    prompt_tokens: Option<u32>,
    pending_tokens: u32,
}

impl ChunkAccounting {
    fn new(prompt_tokens: usize) -> Self {
        ChunkAccounting { prompt_tokens: Some(u32::try_from(prompt_tokens).unwrap_or(u32::MAX)), pending_tokens: 0 }
    }

    /// The item a detokenized step becomes (built by `make(text, finish_reason,
    /// is_first)`), or `None` when it carries only tokens. An engine error, or a
    /// finish reason `error`, becomes an `Err` item.
    fn take<T>(
        &mut self,
        result: Result<LLMEngineOutput, EngineError>,
        make: impl FnOnce(String, Option<String>, bool) -> T,
    ) -> Option<Result<StreamItem<T>, EngineError>> {
        let out = match result {
            Ok(out) => out,
            Err(e) => return Some(Err(e)),
        };
        if let Some(FinishReason::Error(message)) = out.finish_reason {
            return Some(Err(EngineError::Internal(message)));
        }
        let tokens = self.pending_tokens.saturating_add(u32::try_from(out.token_ids.len()).unwrap_or(u32::MAX));
        let text = out.text.unwrap_or_default();
        if text.is_empty() && out.finish_reason.is_none() {
            self.pending_tokens = tokens;
            return None;
        }
        self.pending_tokens = 0;
        let first = self.prompt_tokens.is_some();
        let finish = out.finish_reason.map(|f| f.as_openai().to_string());
        Some(Ok(StreamItem {
            data: make(text, finish, first),
            prompt_tokens: self.prompt_tokens.take(),
            completion_tokens: tokens,
        }))
    }
}

#[async_trait]
impl OpenAIEngine for Pipeline {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        let pre = self.preprocessor.preprocess_chat(&request)?;
        let stream = self.generate(&pre, ctx).await?;
        let id = format!("chatcmpl-{}", uuid::Uuid::new_v4());
        let model = request.model;
        let created = unix_now();
        let mut accounting = ChunkAccounting::new(pre.request.token_ids.len());
        let chunks = stream.filter_map(move |result| {
            future::ready(accounting.take(result, |text, finish_reason, first| {
                let delta = ChatDelta {
                    role: first.then(|| "assistant".to_string()),
                    content: (!text.is_empty()).then_some(text),
                };
                ChatCompletionChunk::new(
                    &id,
                    &model,
                    created,
                    ChatChunkChoice { index: 0, delta, finish_reason, logprobs: None },
                )
            }))
        });
        Ok(chunks.boxed())
    }

    async fn completion(
        &self,
        request: CompletionRequest,
        ctx: RequestContext,
    ) -> Result<CompletionStream, EngineError> {
        let pre = self.preprocessor.preprocess_completion(&request)?;
        let stream = self.generate(&pre, ctx).await?;
        let id = format!("cmpl-{}", uuid::Uuid::new_v4());
        let model = request.model;
        let created = unix_now();
        // `echo`: the prompt is returned before the completion.
        let mut echo = request.echo.unwrap_or(false).then(|| pre.formatted_prompt.clone());
        let mut accounting = ChunkAccounting::new(pre.request.token_ids.len());
        let chunks = stream.filter_map(move |result| {
            future::ready(accounting.take(result, |text, finish_reason, first| {
                let text = match (first, echo.take()) {
                    (true, Some(prompt)) => prompt + &text,
                    _ => text,
                };
                CompletionResponse::new(
                    &id,
                    &model,
                    created,
                    CompletionChoice { index: 0, text, finish_reason, logprobs: None },
                )
            }))
        });
        Ok(chunks.boxed())
    }
}

//! A token engine served as an OpenAI engine: preprocess → token engine → detokenize
//! → OpenAI chunks.

use std::sync::Arc;

use async_trait::async_trait;
use futures::{future, StreamExt};

use crate::chat_output::ChatOutput;
use crate::detokenizer::detokenize;
use crate::engine::EngineFactory;
use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext, StreamItem, TokenEngine, TokenStream,
};
use crate::model_card::{CardError, ModelDeploymentCard};
use crate::preprocessor::{blocking, chat_input_bytes, completion_input_bytes, Preprocessed, Preprocessor};
use crate::protocols::common::{FinishReason, LLMEngineOutput};
use crate::protocols::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, CompletionChoice, CompletionRequest,
    CompletionResponse,
};
use crate::protocols::{logprobs, unix_now};
use crate::tokenizer::UTF8_CONTEXT_TOKENS;

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

    /// The [`EngineFactory`] a frontend's [`crate::frontend::ModelWatcher`] uses for
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

    /// A log probability collector when the request asked for them.
    fn collector(&self, pre: &Preprocessed, shape: LogprobShape) -> Option<LogprobCollector> {
        pre.request.output_options.logprobs.map(|_| LogprobCollector {
            tokenizer: self.preprocessor.tokenizer().clone(),
            shape,
            pending: Vec::new(),
            offset: 0,
            sampled: Vec::new(),
        })
    }

    /// Run the engine on a preprocessed request and detokenize its output.
    async fn generate(&self, pre: &Preprocessed, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        // Admission: the prompt's tokens are queued until its first token (or refused).
        crate::admission::charge_prompt_tokens(pre.request.token_ids.len())?;
        let stream = self.engine.generate(pre.request.clone(), ctx.clone()).await?;
        Ok(detokenize(self.preprocessor.tokenizer(), &pre.request, stream, ctx))
    }
}

/// Which OpenAI `logprobs` shape a response uses.
#[derive(Clone, Copy)]
enum LogprobShape {
    Chat,
    Completion,
}

/// Collects the log probabilities of a response's tokens (when the client asked),
/// decoding each token and alternative to its text.
struct LogprobCollector {
    tokenizer: crate::tokenizer::Tokenizer,
    shape: LogprobShape,
    pending: Vec<logprobs::TokenLogprob>,
    offset: usize,
    /// The last sampled ids (at most [`UTF8_CONTEXT_TOKENS`]): what a half character
    /// among the next tokens may complete.
    sampled: Vec<u32>,
}

impl LogprobCollector {
    /// A token's text after the sampled tokens so far (vLLM's listing).
    fn token_text(&self, id: u32) -> String {
        self.tokenizer.token_text_after(&self.sampled, id)
    }

    fn add(&mut self, out: &LLMEngineOutput) {
        let Some(values) = &out.log_probs else { return };
        for (i, (&id, &logprob)) in out.token_ids.iter().zip(values).enumerate() {
            let top = out
                .top_log_probs
                .as_ref()
                .and_then(|t| t.get(i))
                .map(|alts| alts.iter().map(|a| (self.token_text(a.token_id), a.logprob)).collect())
                .unwrap_or_default();
            self.pending.push(logprobs::TokenLogprob { token: self.token_text(id), logprob, top });
            if self.sampled.len() == UTF8_CONTEXT_TOKENS {
                self.sampled.remove(0);
            }
            self.sampled.push(id);
        }
    }

    fn take(&mut self) -> serde_json::Value {
        let tokens = std::mem::take(&mut self.pending);
        match self.shape {
            LogprobShape::Chat => logprobs::chat(tokens),
            LogprobShape::Completion => {
                let (value, next) = logprobs::completion(tokens, self.offset);
                self.offset = next;
                value
            }
        }
    }
}

/// Turns detokenized steps into OpenAI items: steps with no text and no finish are
/// folded into the next item (their tokens still counted); the first item carries
/// the prompt token count.
struct ChunkAccounting {
    prompt_tokens: Option<u32>,
    pending_tokens: u32,
    /// The engine's cached prompt tokens, until an item carries them.
    cached_tokens: Option<u32>,
    logprobs: Option<LogprobCollector>,
}

impl ChunkAccounting {
    fn new(prompt_tokens: usize, logprobs: Option<LogprobCollector>) -> Self {
        ChunkAccounting {
            prompt_tokens: Some(u32::try_from(prompt_tokens).unwrap_or(u32::MAX)),
            pending_tokens: 0,
            cached_tokens: None,
            logprobs,
        }
    }

    /// The item a detokenized step becomes (built by `make(text, finish_reason,
    /// is_first, logprobs)`), or `None` when it carries only tokens. An engine error,
    /// or a finish reason `error`, becomes an `Err` item.
    fn take<T>(
        &mut self,
        result: Result<LLMEngineOutput, EngineError>,
        make: impl FnOnce(String, Option<String>, bool, Option<serde_json::Value>) -> T,
    ) -> Option<Result<StreamItem<T>, EngineError>> {
        self.take_some(result, |text, finish, first, logprobs| Some(make(text, finish, first, logprobs)))
    }

    /// [`Self::take`], where `make` may find nothing to send (text an output parser
    /// holds back): the step's tokens then go with the next item, as for a step with
    /// no text. `make` must not return `None` when it was given log probabilities.
    fn take_some<T>(
        &mut self,
        result: Result<LLMEngineOutput, EngineError>,
        make: impl FnOnce(String, Option<String>, bool, Option<serde_json::Value>) -> Option<T>,
    ) -> Option<Result<StreamItem<T>, EngineError>> {
        let out = match result {
            Ok(out) => out,
            Err(e) => return Some(Err(e)),
        };
        if let Some(FinishReason::Error(message)) = out.finish_reason {
            return Some(Err(EngineError::Internal(message)));
        }
        let tokens = self.pending_tokens.saturating_add(u32::try_from(out.token_ids.len()).unwrap_or(u32::MAX));
        if let Some(collector) = &mut self.logprobs {
            collector.add(&out);
        }
        if out.cached_tokens.is_some() {
            self.cached_tokens = out.cached_tokens;
        }
        let text = out.text.unwrap_or_default();
        if text.is_empty() && out.finish_reason.is_none() {
            self.pending_tokens = tokens;
            return None;
        }
        let first = self.prompt_tokens.is_some();
        let finish = out.finish_reason.map(|f| f.as_openai().to_string());
        let logprobs = self.logprobs.as_mut().map(LogprobCollector::take);
        let Some(data) = make(text, finish, first, logprobs) else {
            self.pending_tokens = tokens;
            return None;
        };
        self.pending_tokens = 0;
        Some(Ok(StreamItem {
            data,
            prompt_tokens: self.prompt_tokens.take(),
            completion_tokens: tokens,
            cached_tokens: self.cached_tokens.take(),
        }))
    }
}

#[async_trait]
impl OpenAIEngine for Pipeline {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        let bytes = chat_input_bytes(&request);
        self.preprocessor.check_prompt_bytes(bytes)?;
        let preprocessor = self.preprocessor.clone();
        let (pre, request) =
            blocking::run(bytes, move || preprocessor.preprocess_chat(&request).map(|pre| (pre, request))).await?;
        self.chat_preprocessed(request, pre, ctx).await
    }

    async fn completion(
        &self,
        request: CompletionRequest,
        ctx: RequestContext,
    ) -> Result<CompletionStream, EngineError> {
        let bytes = completion_input_bytes(&request);
        self.preprocessor.check_prompt_bytes(bytes)?;
        let preprocessor = self.preprocessor.clone();
        let (pre, request) =
            blocking::run(bytes, move || preprocessor.preprocess_completion(&request).map(|pre| (pre, request)))
                .await?;
        self.completion_preprocessed(request, pre, ctx).await
    }
}

impl Pipeline {
    /// The chat chunks of `request`, already preprocessed into `pre` (by this
    /// pipeline's preprocessor): run the engine, detokenize, build the chunks. A
    /// processor that routes on the token ids itself preprocesses first, then calls this.
    pub async fn chat_preprocessed(
        &self,
        request: ChatCompletionRequest,
        pre: Preprocessed,
        ctx: RequestContext,
    ) -> Result<ChatStream, EngineError> {
        // Built before the engine starts: a card with a parser name this build does not
        // know is refused without generating.
        let mut output = ChatOutput::new(&pre.output).map_err(|e| EngineError::Internal(format!("model card: {e}")))?;
        let stream = self.generate(&pre, ctx).await?;
        let id = format!("chatcmpl-{}", uuid::Uuid::new_v4());
        let model = request.model;
        let created = unix_now();
        let collector = self.collector(&pre, LogprobShape::Chat);
        let mut accounting = ChunkAccounting::new(pre.request.token_ids.len(), collector);
        let chunks = stream.filter_map(move |result| {
            future::ready(accounting.take_some(result, |text, finish_reason, first, logprobs| {
                let (delta, finish_reason) = match &mut output {
                    None => (ChatDelta { content: (!text.is_empty()).then_some(text), ..Default::default() }, finish_reason),
                    Some(output) => {
                        let (step, finish_reason) = output.step(&text, finish_reason);
                        let delta = ChatDelta {
                            content: (!step.content.is_empty()).then_some(step.content),
                            reasoning_content: (!step.reasoning.is_empty()).then_some(step.reasoning),
                            tool_calls: (!step.calls.is_empty()).then_some(step.calls),
                            ..Default::default()
                        };
                        (delta, finish_reason)
                    }
                };
                if !first && finish_reason.is_none() && logprobs.is_none() && delta == ChatDelta::default() {
                    // Text the parsers hold back (inside a call): nothing to send yet.
                    return None;
                }
                let delta = ChatDelta { role: first.then(|| "assistant".to_string()), ..delta };
                Some(ChatCompletionChunk::new(
                    &id,
                    &model,
                    created,
                    ChatChunkChoice { index: 0, delta, finish_reason, logprobs },
                ))
            }))
        });
        Ok(chunks.boxed())
    }

    /// The completion chunks of `request`, already preprocessed into `pre` (see
    /// [`Self::chat_preprocessed`]).
    pub async fn completion_preprocessed(
        &self,
        request: CompletionRequest,
        pre: Preprocessed,
        ctx: RequestContext,
    ) -> Result<CompletionStream, EngineError> {
        let stream = self.generate(&pre, ctx).await?;
        let id = format!("cmpl-{}", uuid::Uuid::new_v4());
        let model = request.model;
        let created = unix_now();
        // `echo`: the prompt is returned before the completion.
        let mut echo = request.echo.unwrap_or(false).then(|| pre.formatted_prompt.clone());
        let collector = self.collector(&pre, LogprobShape::Completion);
        let mut accounting = ChunkAccounting::new(pre.request.token_ids.len(), collector);
        let chunks = stream.filter_map(move |result| {
            future::ready(accounting.take(result, |text, finish_reason, first, logprobs| {
                let text = match (first, echo.take()) {
                    (true, Some(prompt)) => prompt + &text,
                    _ => text,
                };
                CompletionResponse::new(
                    &id,
                    &model,
                    created,
                    CompletionChoice { index: 0, text, finish_reason, logprobs },
                )
            }))
        });
        Ok(chunks.boxed())
    }
}

//! Echo engines, for trying the serving path without a model.
//!
//! - [`EchoFull`] (an [`OpenAIEngine`]) echoes the last user message (chat) or the
//!   prompt (completions) one character per chunk, then a `stop` chunk; one
//!   character counts as one token, and `max_tokens` limits the characters.
//! - [`EchoCore`] (a [`TokenEngine`]) echoes the prompt's token ids one per step.
//!
//! Both wait a delay per step (`DYN_TOKEN_ECHO_DELAY_MS`, default 10 ms) and stop
//! promptly when the request is stopped (a last item with finish reason
//! `cancelled`) or killed (the stream just ends).

use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;

use crate::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext, StreamItem, TokenEngine, TokenStream,
};
use crate::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use crate::detokenizer::StopJail;
use crate::protocols::logprobs;
use crate::protocols::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, CompletionChoice, CompletionRequest,
    CompletionResponse, Prompt, StopSpec,
};
use crate::protocols::unix_now;

/// Environment variable with the per-step delay in milliseconds.
pub const ECHO_DELAY_ENV: &str = "DYN_TOKEN_ECHO_DELAY_MS";

const DEFAULT_ECHO_DELAY: Duration = Duration::from_millis(10);

/// The per-step delay from `DYN_TOKEN_ECHO_DELAY_MS` (default 10 ms; 0 = none).
pub fn echo_delay_from_env() -> Duration {
    std::env::var(ECHO_DELAY_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(DEFAULT_ECHO_DELAY, Duration::from_millis)
}

/// What happened while waiting between steps.
enum Pause {
    Go,
    Stopped,
    Killed,
}

/// Wait `delay` unless the request is stopped first.
async fn pause(delay: Duration, ctx: &RequestContext) -> Pause {
    if !ctx.is_stopped() && !delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = ctx.stopped() => {}
        }
    }
    if ctx.is_killed() {
        Pause::Killed
    } else if ctx.is_stopped() {
        Pause::Stopped
    } else {
        Pause::Go
    }
}

/// One step of an echo: the next unit, or how the echo ends.
enum Step<T> {
    Unit(T),
    Finish(FinishReason),
}

/// Walks through `units` with a delay per unit, honouring a limit and the context.
struct Echo<T> {
    units: std::vec::IntoIter<T>,
    emitted: usize,
    limit: Option<usize>,
    delay: Duration,
    ctx: RequestContext,
    done: bool,
}

impl<T> Echo<T> {
    fn new(units: Vec<T>, limit: Option<u32>, delay: Duration, ctx: RequestContext) -> Self {
        let limit = limit.map(|l| usize::try_from(l).unwrap_or(usize::MAX));
        Echo { units: units.into_iter(), emitted: 0, limit, delay, ctx, done: false }
    }

    async fn next(&mut self) -> Option<Step<T>> {
        if self.done {
            return None;
        }
        if self.limit.is_some_and(|l| self.emitted >= l) && self.units.len() > 0 {
            self.done = true;
            return Some(Step::Finish(FinishReason::Length));
        }
        let Some(unit) = self.units.next() else {
            self.done = true;
            return Some(Step::Finish(FinishReason::Stop));
        };
        match pause(self.delay, &self.ctx).await {
            Pause::Go => {
                self.emitted += 1;
                Some(Step::Unit(unit))
            }
            Pause::Stopped => {
                self.done = true;
                Some(Step::Finish(FinishReason::Cancelled))
            }
            Pause::Killed => {
                self.done = true;
                None
            }
        }
    }
}

/// Echoes OpenAI requests as chunks, character by character.
#[derive(Debug, Clone)]
pub struct EchoFull {
    delay: Duration,
}

impl EchoFull {
    /// An echo engine waiting `delay` per character.
    pub fn new(delay: Duration) -> Self {
        EchoFull { delay }
    }

    /// An echo engine with the delay from `DYN_TOKEN_ECHO_DELAY_MS`.
    pub fn from_env() -> Self {
        EchoFull::new(echo_delay_from_env())
    }
}

/// What an echo of characters is asked for.
struct CharEcho {
    limit: Option<u32>,
    stops: Vec<String>,
    logprobs: bool,
}

/// Chars of `text` as an echo with OpenAI items built by `make(text, finish, first,
/// logprob tokens)`. Stop strings end it with `stop` and are not emitted (text that may
/// start one is held back). Each character is certain: its log probability is 0.
fn echo_chars<T: Send + 'static>(
    text: &str,
    options: CharEcho,
    delay: Duration,
    ctx: RequestContext,
    make: impl FnMut(String, Option<String>, bool, Option<Vec<String>>) -> T + Send + 'static,
) -> futures::stream::BoxStream<'static, Result<StreamItem<T>, EngineError>> {
    let chars: Vec<char> = text.chars().collect();
    let prompt_tokens = u32::try_from(chars.len()).unwrap_or(u32::MAX);
    let echo = Echo::new(chars, options.limit, delay, ctx);
    let jail = StopJail::new(options.stops);
    let logprobs = options.logprobs;
    let state = (echo, jail, make, true, false);
    futures::stream::unfold(state, move |(mut echo, mut jail, mut make, first, ended)| async move {
        if ended {
            return None;
        }
        let mut consumed = 0u32;
        let mut pieces = Vec::new();
        let (text, finish) = loop {
            match echo.next().await? {
                Step::Unit(c) => {
                    consumed += 1;
                    let mut buf = [0u8; 4];
                    let piece: &str = c.encode_utf8(&mut buf);
                    if logprobs {
                        pieces.push(piece.to_string());
                    }
                    let (emit, matched) = jail.push(piece, true);
                    if matched {
                        break (emit, Some(FinishReason::Stop));
                    }
                    if !emit.is_empty() {
                        break (emit, None);
                    }
                }
                Step::Finish(reason) => break (jail.release(), Some(reason)),
            }
        };
        let ended = finish.is_some();
        let finish = finish.map(|f| f.as_openai().to_string());
        let data = make(text, finish, first, logprobs.then_some(pieces));
        let item = StreamItem { data, prompt_tokens: first.then_some(prompt_tokens), completion_tokens: consumed, cached_tokens: None };
        Some((Ok(item), (echo, jail, make, false, ended)))
    })
    .boxed()
}

#[async_trait]
impl OpenAIEngine for EchoFull {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        let text = request
            .messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .and_then(|m| m.content.as_ref().map(|c| c.text()))
            .unwrap_or_default();
        let id = format!("chatcmpl-{}", uuid::Uuid::new_v4());
        let created = unix_now();
        let model = request.model.clone();
        let top = request.top_logprobs.unwrap_or(0);
        let options = CharEcho {
            limit: request.max_tokens(),
            stops: request.stop.clone().map(StopSpec::into_vec).unwrap_or_default(),
            logprobs: request.wants_logprobs(),
        };
        Ok(echo_chars(&text, options, self.delay, ctx, move |content, finish_reason, first, tokens| {
            let delta = ChatDelta {
                role: first.then(|| "assistant".to_string()),
                content: (!content.is_empty()).then_some(content),
                ..Default::default()
            };
            let logprobs = tokens.map(|tokens| {
                logprobs::chat(tokens.into_iter().map(|t| logprobs::TokenLogprob::certain(t, top)).collect())
            });
            ChatCompletionChunk::new(&id, &model, created, ChatChunkChoice { index: 0, delta, finish_reason, logprobs })
        }))
    }

    async fn completion(
        &self,
        request: CompletionRequest,
        ctx: RequestContext,
    ) -> Result<CompletionStream, EngineError> {
        let text = match &request.prompt {
            Prompt::Text(text) => text.clone(),
            Prompt::TextList(list) if list.len() == 1 => list[0].clone(),
            Prompt::TextList(_) => return Err(EngineError::BadRequest("prompt must be a single string".to_string())),
            Prompt::Tokens(_) => {
                return Err(EngineError::BadRequest("echo_full echoes text prompts, not token ids".to_string()))
            }
        };
        let id = format!("cmpl-{}", uuid::Uuid::new_v4());
        let created = unix_now();
        let model = request.model.clone();
        let top = request.logprobs;
        let options = CharEcho {
            limit: request.max_tokens,
            stops: request.stop.clone().map(StopSpec::into_vec).unwrap_or_default(),
            logprobs: top.is_some(),
        };
        let mut offset = 0usize;
        Ok(echo_chars(&text, options, self.delay, ctx, move |text, finish_reason, _, tokens| {
            let logprobs = tokens.map(|tokens| {
                let tokens: Vec<_> = tokens.into_iter().map(|t| logprobs::TokenLogprob::certain(t, top.unwrap_or(0))).collect();
                let (value, next) = logprobs::completion(tokens, offset);
                offset = next;
                value
            });
            CompletionResponse::new(&id, &model, created, CompletionChoice { index: 0, text, finish_reason, logprobs })
        }))
    }
}

/// Echoes a tokenized prompt's ids, one per step.
#[derive(Debug, Clone)]
pub struct EchoCore {
    delay: Duration,
}

impl EchoCore {
    /// An echo engine waiting `delay` per token.
    pub fn new(delay: Duration) -> Self {
        EchoCore { delay }
    }

    /// An echo engine with the delay from `DYN_TOKEN_ECHO_DELAY_MS`.
    pub fn from_env() -> Self {
        EchoCore::new(echo_delay_from_env())
    }
}

#[async_trait]
impl TokenEngine for EchoCore {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let echo = Echo::new(request.token_ids, request.stop_conditions.max_tokens, self.delay, ctx);
        Ok(futures::stream::unfold(echo, |mut echo| async move {
            let out = match echo.next().await? {
                Step::Unit(id) => LLMEngineOutput { token_ids: vec![id], ..Default::default() },
                Step::Finish(reason) => LLMEngineOutput { finish_reason: Some(reason), ..Default::default() },
            };
            Some((Ok(out), echo))
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::common::StopConditions;

    async fn collect_core(req: PreprocessedRequest, ctx: RequestContext) -> Vec<LLMEngineOutput> {
        let stream = EchoCore::new(Duration::ZERO).generate(req, ctx).await.unwrap();
        tokio::time::timeout(Duration::from_secs(10), stream.map(|r| r.unwrap()).collect()).await.unwrap()
    }

    #[tokio::test]
    async fn core_echoes_ids_then_stops() {
        let out = collect_core(
            PreprocessedRequest { token_ids: vec![5, 6, 7], ..Default::default() },
            RequestContext::new("r"),
        )
        .await;
        let ids: Vec<u32> = out.iter().flat_map(|o| o.token_ids.clone()).collect();
        assert_eq!(ids, vec![5, 6, 7]);
        assert_eq!(out.last().unwrap().finish_reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn core_honours_max_tokens() {
        let req = PreprocessedRequest {
            token_ids: vec![5, 6, 7],
            stop_conditions: StopConditions { max_tokens: Some(2), ..Default::default() },
            ..Default::default()
        };
        let out = collect_core(req, RequestContext::new("r")).await;
        let ids: Vec<u32> = out.iter().flat_map(|o| o.token_ids.clone()).collect();
        assert_eq!(ids, vec![5, 6]);
        assert_eq!(out.last().unwrap().finish_reason, Some(FinishReason::Length));
    }

    #[tokio::test]
    async fn a_stopped_context_ends_the_echo() {
        let ctx = RequestContext::new("r");
        ctx.stop_generating();
        let out = collect_core(PreprocessedRequest { token_ids: vec![5, 6, 7], ..Default::default() }, ctx).await;
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].finish_reason, Some(FinishReason::Cancelled));

        let ctx = RequestContext::new("r");
        ctx.kill();
        assert!(collect_core(PreprocessedRequest { token_ids: vec![5], ..Default::default() }, ctx).await.is_empty());
    }

    #[tokio::test]
    async fn stopping_interrupts_a_long_delay() {
        let ctx = RequestContext::new("r");
        let engine = EchoCore::new(Duration::from_secs(3600));
        let mut stream = engine
            .generate(PreprocessedRequest { token_ids: vec![1, 2], ..Default::default() }, ctx.clone())
            .await
            .unwrap();
        let stopper = {
            let ctx = ctx.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                ctx.stop_generating();
            })
        };
        let first = tokio::time::timeout(Duration::from_secs(10), stream.next()).await.unwrap().unwrap().unwrap();
        assert_eq!(first.finish_reason, Some(FinishReason::Cancelled));
        stopper.await.unwrap();
    }

    #[tokio::test]
    async fn full_echoes_chat_char_by_char() {
        let req: ChatCompletionRequest = serde_json::from_str(
            r#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"hé!"}]}"#,
        )
        .unwrap();
        let stream = EchoFull::new(Duration::ZERO).chat(req, RequestContext::new("r")).await.unwrap();
        let items: Vec<_> =
            tokio::time::timeout(Duration::from_secs(10), stream.map(|r| r.unwrap()).collect::<Vec<_>>())
                .await
                .unwrap();
        let contents: Vec<String> = items.iter().filter_map(|i| i.data.choices[0].delta.content.clone()).collect();
        assert_eq!(contents, vec!["h", "é", "!"]);
        assert_eq!(items[0].data.choices[0].delta.role.as_deref(), Some("assistant"));
        assert_eq!(items.last().unwrap().data.choices[0].finish_reason.as_deref(), Some("stop"));
    }

    #[tokio::test]
    async fn full_completion_limits_chars() {
        let req: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":"abcdef","max_tokens":2}"#).unwrap();
        let stream = EchoFull::new(Duration::ZERO).completion(req, RequestContext::new("r")).await.unwrap();
        let items: Vec<_> =
            tokio::time::timeout(Duration::from_secs(10), stream.map(|r| r.unwrap()).collect::<Vec<_>>())
                .await
                .unwrap();
        let text: String = items.iter().map(|i| i.data.choices[0].text.clone()).collect();
        assert_eq!(text, "ab");
        assert_eq!(items.last().unwrap().data.choices[0].finish_reason.as_deref(), Some("length"));
    }
}

//! The "backend" step: a token engine's output in, text deltas out.
//!
//! Token ids are decoded incrementally (only complete UTF-8 text is emitted), and the
//! request's stop conditions are enforced on the way: a hidden stop id (EOS) ends the
//! stream without its text, `max_tokens` ends it with `length`, and a stop string
//! ends it with `stop` without ever being emitted — text that could be the start of
//! a stop string is held back until it either completes one or cannot. When the
//! detokenizer ends a stream the engine did not end, it stops the request's context
//! so the engine stops generating.

use std::collections::HashSet;
use std::sync::Arc;

use async_trait::async_trait;
use futures::StreamExt;

use crate::engine::{EngineError, RequestContext, TokenEngine, TokenStream};
use crate::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use crate::tokenizer::{IncrementalDecoder, Tokenizer, TokenizerError};

/// Detokenize `stream`, the output of a token engine for `request`. Every output item
/// has `text` set (the delta, possibly empty), the `token_ids` it consumed, and on
/// the last item a `finish_reason`.
pub fn detokenize(
    tokenizer: &Tokenizer,
    request: &PreprocessedRequest,
    stream: TokenStream,
    ctx: RequestContext,
) -> TokenStream {
    let state = Detokenizer::new(tokenizer, request, stream, ctx);
    futures::stream::unfold(state, |mut state| async move { state.next().await.map(|item| (item, state)) }).boxed()
}

/// A [`TokenEngine`] whose output is already detokenized (`text` set, stop
/// conditions applied): what a worker serving a core engine puts in front of it.
pub struct DetokenizingEngine {
    inner: Arc<dyn TokenEngine>,
    tokenizer: Tokenizer,
}

impl DetokenizingEngine {
    /// Detokenize `inner`'s output with `tokenizer`.
    pub fn new(inner: Arc<dyn TokenEngine>, tokenizer: Tokenizer) -> Self {
        DetokenizingEngine { inner, tokenizer }
    }
}

#[async_trait]
impl TokenEngine for DetokenizingEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        let stream = self.inner.generate(request.clone(), ctx.clone()).await?;
        Ok(detokenize(&self.tokenizer, &request, stream, ctx))
    }
}

/// The state of one detokenized stream.
struct Detokenizer {
    inner: TokenStream,
    decoder: IncrementalDecoder,
    jail: StopJail,
    /// Ids that end the stream unseen (EOS included).
    hidden: HashSet<u32>,
    eos: HashSet<u32>,
    max_tokens: Option<u32>,
    min_tokens: u32,
    generated: u32,
    ctx: RequestContext,
    done: bool,
}

impl Detokenizer {
    fn new(tokenizer: &Tokenizer, request: &PreprocessedRequest, inner: TokenStream, ctx: RequestContext) -> Self {
        let stop = &request.stop_conditions;
        let ignore_eos = stop.ignore_eos.unwrap_or(false);
        let eos: HashSet<u32> =
            if ignore_eos { HashSet::new() } else { request.eos_token_ids.iter().copied().collect() };
        let mut hidden = eos.clone();
        if !ignore_eos {
            hidden.extend(stop.stop_token_ids_hidden.iter().flatten().copied());
        }
        let stops = if ignore_eos { Vec::new() } else { stop.stop.clone().unwrap_or_default() };
        Detokenizer {
            inner,
            decoder: tokenizer.decode_stream_after(&request.token_ids, !request.output_options.keep_special_tokens),
            jail: StopJail::new(stops),
            hidden,
            eos,
            max_tokens: stop.max_tokens,
            min_tokens: stop.min_tokens.unwrap_or(0),
            generated: 0,
            ctx,
            done: false,
        }
    }

    async fn next(&mut self) -> Option<Result<LLMEngineOutput, EngineError>> {
        if self.done {
            return None;
        }
        let result = match self.inner.next().await {
            Some(Ok(item)) => self.step(item),
            Some(Err(e)) => Err(e),
            // The engine ended without saying why. After a stop or kill that is the
            // cancellation's end; otherwise the response is incomplete and must not
            // reach the client as a normal end.
            None if self.ctx.is_stopped() => {
                self.step(LLMEngineOutput { finish_reason: Some(FinishReason::Cancelled), ..Default::default() })
            }
            None => Err(EngineError::Internal(
                "the engine's stream ended without a finish reason; the response is incomplete".to_string(),
            )),
        };
        match &result {
            Ok(out) => self.done = out.finish_reason.is_some(),
            Err(_) => self.done = true,
        }
        Some(result)
    }

    fn step(&mut self, item: LLMEngineOutput) -> Result<LLMEngineOutput, EngineError> {
        let decode_error = |e: TokenizerError| EngineError::Internal(e.to_string());
        let mut text = String::new();
        let mut consumed = Vec::with_capacity(item.token_ids.len());
        let mut finish = None;
        if let Some(given) = &item.text {
            // The engine decoded itself; only count its tokens.
            consumed.extend_from_slice(&item.token_ids);
            self.generated = self.generated.saturating_add(u32::try_from(consumed.len()).unwrap_or(u32::MAX));
            text.push_str(given);
            if self.max_tokens.is_some_and(|m| self.generated >= m) {
                finish = Some(FinishReason::Length);
            }
        } else {
            for &id in &item.token_ids {
                consumed.push(id);
                self.generated = self.generated.saturating_add(1);
                if self.hidden.contains(&id) && self.generated > self.min_tokens {
                    finish = Some(if self.eos.contains(&id) { FinishReason::Eos } else { FinishReason::Stop });
                    break;
                }
                if let Some(piece) = self.decoder.step(id).map_err(decode_error)? {
                    text.push_str(&piece);
                }
                if self.max_tokens.is_some_and(|m| self.generated >= m) {
                    finish = Some(FinishReason::Length);
                    break;
                }
            }
        }

        let ending = finish.is_some() || item.finish_reason.is_some();
        if ending {
            if let Some(rest) = self.decoder.flush().map_err(decode_error)? {
                text.push_str(&rest);
            }
        }
        let stops_active = self.generated >= self.min_tokens;
        let (mut emit, matched) = self.jail.push(&text, stops_active);
        if matched {
            finish = Some(FinishReason::Stop);
        } else if ending {
            emit.push_str(&self.jail.release());
        }
        if finish.is_some() && item.finish_reason.is_none() {
            // We end the stream, not the engine: tell it to stop generating.
            self.ctx.stop_generating();
        }
        Ok(LLMEngineOutput {
            token_ids: consumed,
            tokens: None,
            text: Some(emit),
            cum_log_probs: item.cum_log_probs,
            log_probs: item.log_probs,
            top_log_probs: item.top_log_probs,
            finish_reason: finish.or(item.finish_reason),
            cached_tokens: item.cached_tokens,
        })
    }
}

/// Holds back text that may be the start of a stop string.
#[derive(Debug, Default)]
pub(crate) struct StopJail {
    stops: Vec<String>,
    held: String,
}

impl StopJail {
    pub(crate) fn new(stops: Vec<String>) -> Self {
        StopJail { stops: stops.into_iter().filter(|s| !s.is_empty()).collect(), held: String::new() }
    }

    /// Add `text`; returns what may be emitted now, and whether a stop string matched
    /// (then the returned text is everything before it and the rest is dropped).
    /// With `active` false (before `min_tokens`), nothing is matched or held.
    pub(crate) fn push(&mut self, text: &str, active: bool) -> (String, bool) {
        self.held.push_str(text);
        if self.stops.is_empty() || !active {
            return (std::mem::take(&mut self.held), false);
        }
        if let Some(pos) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.held.truncate(pos);
            return (std::mem::take(&mut self.held), true);
        }
        let split = self.held.len() - self.partial_suffix_len();
        let emit = self.held[..split].to_string();
        self.held.drain(..split);
        (emit, false)
    }

    /// Everything held (the stream ends; no stop string can complete any more).
    pub(crate) fn release(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_suffix_len(&self) -> usize {
        let held = self.held.as_str();
        let mut best = 0;
        for stop in &self.stops {
            let longest = (stop.len() - 1).min(held.len());
            for k in (best + 1..=longest).rev() {
                let start = held.len() - k;
                if held.is_char_boundary(start) && stop.starts_with(&held[start..]) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_card::ModelDeploymentCard;
    use crate::protocols::common::StopConditions;

    fn tokenizer() -> Tokenizer {
        ModelDeploymentCard::builtin("t").tokenizer().unwrap()
    }

    /// Engine output: one item per group of ids, the last with `finish`.
    fn engine(groups: Vec<Vec<u32>>, finish: Option<FinishReason>) -> TokenStream {
        let n = groups.len();
        let items: Vec<Result<LLMEngineOutput, EngineError>> = groups
            .into_iter()
            .enumerate()
            .map(|(i, token_ids)| {
                Ok(LLMEngineOutput {
                    token_ids,
                    finish_reason: if i + 1 == n { finish.clone() } else { None },
                    ..Default::default()
                })
            })
            .collect();
        futures::stream::iter(items).boxed()
    }

    fn request(stop: StopConditions, eos: Vec<u32>) -> PreprocessedRequest {
        PreprocessedRequest { token_ids: vec![3], stop_conditions: stop, eos_token_ids: eos, ..Default::default() }
    }

    async fn run(
        req: &PreprocessedRequest,
        groups: Vec<Vec<u32>>,
        finish: Option<FinishReason>,
    ) -> (Vec<String>, Option<FinishReason>, RequestContext) {
        let tok = tokenizer();
        let ctx = RequestContext::new("t");
        let out: Vec<_> = detokenize(&tok, req, engine(groups, finish), ctx.clone()).collect().await;
        let items: Vec<LLMEngineOutput> = out.into_iter().map(|r| r.unwrap()).collect();
        let finish = items.last().and_then(|o| o.finish_reason.clone());
        (items.into_iter().map(|o| o.text.unwrap()).collect(), finish, ctx)
    }

    fn ids(text: &str) -> Vec<u32> {
        tokenizer().encode(text, false).unwrap()
    }

    /// Each id as its own engine step.
    fn singles(text: &str) -> Vec<Vec<u32>> {
        ids(text).into_iter().map(|id| vec![id]).collect()
    }

    #[tokio::test]
    async fn multibyte_characters_are_emitted_whole() {
        let req = request(StopConditions::default(), vec![]);
        let (texts, finish, ctx) = run(&req, singles("é🦀x"), Some(FinishReason::Stop)).await;
        let nonempty: Vec<_> = texts.iter().filter(|t| !t.is_empty()).cloned().collect();
        assert_eq!(nonempty, vec!["é", "🦀", "x"]);
        assert_eq!(finish, Some(FinishReason::Stop));
        assert!(!ctx.is_stopped(), "the engine finished by itself");
    }

    #[tokio::test]
    async fn stop_string_across_three_tokens_is_never_emitted() {
        let stop = StopConditions { stop: Some(vec!["END".into()]), ..Default::default() };
        let req = request(stop, vec![]);
        let (texts, finish, ctx) = run(&req, singles("abENDcd"), None).await;
        assert_eq!(texts.concat(), "ab");
        assert!(texts.iter().all(|t| !t.contains('E')));
        assert_eq!(finish, Some(FinishReason::Stop));
        assert!(ctx.is_stopped(), "stop_generating was called");
    }

    #[tokio::test]
    async fn an_incomplete_stop_prefix_is_released() {
        let stop = StopConditions { stop: Some(vec!["END".into()]), ..Default::default() };
        let req = request(stop, vec![]);
        let (texts, _, _) = run(&req, singles("aENx"), Some(FinishReason::Length)).await;
        assert_eq!(texts.concat(), "aENx");
        // "EN" is held until "x" shows it is no stop string.
        assert_eq!(texts, vec!["a", "", "", "ENx"]);
        // Held text is released when the stream ends.
        let (texts, finish, _) = run(&req, singles("aEN"), Some(FinishReason::Length)).await;
        assert_eq!(texts.concat(), "aEN");
        assert_eq!(finish, Some(FinishReason::Length));
    }

    #[tokio::test]
    async fn eos_is_hidden_and_ends_the_stream() {
        let req = request(StopConditions::default(), vec![2]);
        let mut groups = singles("hi");
        groups.push(vec![2]);
        groups.push(ids("never"));
        let (texts, finish, ctx) = run(&req, groups, None).await;
        assert_eq!(texts.concat(), "hi");
        assert_eq!(finish, Some(FinishReason::Eos));
        assert!(ctx.is_stopped());
    }

    #[tokio::test]
    async fn eos_before_min_tokens_is_ignored() {
        let stop = StopConditions { min_tokens: Some(3), ..Default::default() };
        let req = request(stop, vec![2]);
        let (texts, finish, _) = run(&req, vec![ids("a"), vec![2], ids("b"), vec![2]], None).await;
        assert_eq!(texts.concat(), "ab");
        assert_eq!(finish, Some(FinishReason::Eos));
    }

    #[tokio::test]
    async fn max_tokens_ends_with_length() {
        let stop = StopConditions { max_tokens: Some(3), ..Default::default() };
        let req = request(stop, vec![]);
        let (texts, finish, ctx) = run(&req, vec![ids("ab"), ids("cd"), ids("ef")], None).await;
        assert_eq!(texts.concat(), "abc");
        assert_eq!(finish, Some(FinishReason::Length));
        assert!(ctx.is_stopped());
    }

    #[tokio::test]
    async fn engine_text_is_used_as_is() {
        let req = request(StopConditions { stop: Some(vec!["!".into()]), ..Default::default() }, vec![]);
        let items = vec![
            Ok(LLMEngineOutput { token_ids: vec![99], text: Some("hello".into()), ..Default::default() }),
            Ok(LLMEngineOutput { token_ids: vec![98], text: Some(" you! x".into()), ..Default::default() }),
        ];
        let out: Vec<_> =
            detokenize(&tokenizer(), &req, futures::stream::iter(items).boxed(), RequestContext::new("t"))
                .map(|r| r.unwrap())
                .collect()
                .await;
        assert_eq!(out.iter().map(|o| o.text.clone().unwrap()).collect::<String>(), "hello you");
        assert_eq!(out.last().unwrap().finish_reason, Some(FinishReason::Stop));
    }

    #[tokio::test]
    async fn an_engine_error_ends_the_stream() {
        let req = request(StopConditions::default(), vec![]);
        let items = vec![
            Ok(LLMEngineOutput { token_ids: ids("a"), ..Default::default() }),
            Err(EngineError::Internal("boom".into())),
        ];
        let out: Vec<_> =
            detokenize(&tokenizer(), &req, futures::stream::iter(items).boxed(), RequestContext::new("t"))
                .collect()
                .await;
        assert_eq!(out.len(), 2);
        assert_eq!(out[1], Err(EngineError::Internal("boom".into())));
    }

    #[tokio::test]
    async fn an_engine_ending_without_a_finish_reason_is_an_error_unless_stopped() {
        let req = request(StopConditions::default(), vec![]);
        let tok = tokenizer();
        let ctx = RequestContext::new("t");
        let out: Vec<_> = detokenize(&tok, &req, engine(singles("ab"), None), ctx).collect().await;
        assert_eq!(out.len(), 3, "two steps, then the error: {out:?}");
        assert!(out[..2].iter().all(Result::is_ok));
        assert!(matches!(&out[2], Err(EngineError::Internal(m)) if m.contains("without a finish reason")), "{out:?}");

        let ctx = RequestContext::new("t");
        ctx.stop_generating();
        let out: Vec<_> = detokenize(&tok, &req, engine(singles("ab"), None), ctx).collect().await;
        let last = out.last().unwrap().as_ref().unwrap();
        assert_eq!(last.finish_reason, Some(FinishReason::Cancelled));
    }

    #[test]
    fn jail_keeps_only_possible_stop_prefixes() {
        let mut jail = StopJail::new(vec!["<|end|>".into(), "xyz".into()]);
        assert_eq!(jail.push("hello <|e", true), ("hello ".to_string(), false));
        assert_eq!(jail.push("n", true), (String::new(), false));
        // "<|en" can no longer become "<|end|>", but the "x" may start "xyz".
        assert_eq!(jail.push("x", true), ("<|en".to_string(), false));
        assert_eq!(jail.push("yz tail", true), (String::new(), true));
        let mut jail = StopJail::new(vec!["é!".into()]);
        assert_eq!(jail.push("aé", true), ("a".to_string(), false));
        assert_eq!(jail.release(), "é");
        assert_eq!(jail.push("ab", false), ("ab".to_string(), false));
    }
}

//! OpenAI request → [`PreprocessedRequest`]: render the chat template, tokenize, and
//! translate the request's limits and sampling options into the token-level form.
//!
//! A chat request is rendered with the model's chat template (or, with
//! `nvext.use_raw_prompt`, its last user message is sent as written). A completions
//! `prompt` is never templated (OpenAI/vLLM semantics); token-id prompts go in as
//! they are.

pub mod blocking;
pub mod prompt;
mod tojson;

use std::sync::Arc;

use crate::chat_output::{ConstrainedCalls, OutputPlan};
use crate::engine::EngineError;
use crate::model_card::{CardError, ModelDeploymentCard};
use crate::protocols::common::{OutputOptions, PreprocessedRequest, SamplingOptions, StopConditions};
use crate::parsers::tool_calls::needs_special_tokens;
use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest, NvExt, Prompt, ResponseFormat, SamplingParams, StopSpec};
use crate::protocols::tools::{ToolChoice, ToolRequest};
use crate::tokenizer::Tokenizer;

use prompt::PromptFormatter;

/// A prompt longer than this many bytes per token of the model's context is refused
/// (400) before it is rendered or tokenized: it could never fit. Real tokenizers
/// average 3–5 bytes per token on text; 16 leaves room for long runs (whitespace,
/// repeated characters) that tokenize into few tokens, and bounds what one request
/// can make the tokenizer do.
pub const MAX_PROMPT_BYTES_PER_TOKEN: usize = 16;

/// Who puts the special tokens (a BOS) around a prompt's text.
#[derive(Clone, Copy)]
enum Specials {
    /// A rendered chat template: it wrote what the model expects, so the text is
    /// tokenized as it is (as vLLM's and HF's chat paths tokenize it).
    FromTemplate,
    /// A completion prompt or a raw chat prompt: the tokenizer adds them, unless the
    /// text already starts with the BOS.
    Add,
}

/// Prompts above this many bytes are counted piece by piece before being tokenized.
const COUNT_FIRST_BYTES: usize = 1024 * 1024;
/// Size of the pieces a big prompt is counted in.
const COUNT_PIECE_BYTES: usize = 64 * 1024;

/// `text` cut into pieces of about `size` bytes, each ending after whitespace where
/// there is some in its second half (else at a character boundary).
fn pieces(text: &str, size: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len().min(size);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end < rest.len() {
            if let Some(ws) = rest[end / 2..end].rfind(char::is_whitespace) {
                let ws = end / 2 + ws;
                end = ws + rest[ws..].chars().next().map_or(1, char::len_utf8);
            }
        }
        let (piece, tail) = rest.split_at(end.max(1).min(rest.len()));
        rest = tail;
        Some(piece)
    })
}

/// Bytes of prompt text in a chat request: the messages' text.
pub fn chat_input_bytes(request: &ChatCompletionRequest) -> usize {
    request.messages.iter().map(|m| m.content.as_ref().map_or(0, |c| c.text_len())).sum()
}

/// Bytes of prompt text in a completions request (0 for token ids).
pub fn completion_input_bytes(request: &CompletionRequest) -> usize {
    match &request.prompt {
        Prompt::Text(text) => text.len(),
        Prompt::TextList(list) => list.iter().map(String::len).sum(),
        Prompt::Tokens(_) => 0,
    }
}

/// A preprocessed request and the prompt text it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocessed {
    /// What the token engine receives.
    pub request: PreprocessedRequest,
    /// The rendered prompt (empty for a token-id prompt).
    pub formatted_prompt: String,
    /// How the chat output is parsed (tool calls, reasoning); nothing for completions.
    pub output: OutputPlan,
}

/// Turns OpenAI requests into token-level requests for one model; built once per
/// model card and shared by its requests.
#[derive(Debug)]
pub struct Preprocessor {
    card: Arc<ModelDeploymentCard>,
    tokenizer: Tokenizer,
    formatter: PromptFormatter,
    mdc_sum: String,
}

/// The request fields both OpenAI request kinds share.
struct RequestLimits<'a> {
    max_tokens: Option<u32>,
    stop: Option<&'a StopSpec>,
    nvext: Option<&'a NvExt>,
    /// The request's sampling fields, with the extensions `nvext` adds.
    sampling: SamplingParams,
    logprobs: Option<u32>,
    /// The engine's constraint: the client's `response_format`, or the tool calls'.
    response_format: Option<serde_json::Value>,
    keep_special_tokens: bool,
}

impl Preprocessor {
    /// Load the card's tokenizer and compile its chat template.
    pub fn new(card: Arc<ModelDeploymentCard>) -> Result<Self, CardError> {
        let tokenizer = card.tokenizer()?;
        let formatter = PromptFormatter::from_card(&card).map_err(|e| CardError::Invalid(e.to_string()))?;
        let mdc_sum = card.checksum();
        Ok(Preprocessor { card, tokenizer, formatter, mdc_sum })
    }

    /// The model card.
    pub fn card(&self) -> &Arc<ModelDeploymentCard> {
        &self.card
    }

    /// The loaded tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// Most prompt bytes accepted: the context length × [`MAX_PROMPT_BYTES_PER_TOKEN`].
    pub fn max_prompt_bytes(&self) -> usize {
        usize::try_from(self.card.context_length).unwrap_or(usize::MAX).saturating_mul(MAX_PROMPT_BYTES_PER_TOKEN)
    }

    /// A 400 when `bytes` of prompt could never fit the model's context; cheap, so it
    /// runs before any rendering or tokenizing.
    pub fn check_prompt_bytes(&self, bytes: usize) -> Result<(), EngineError> {
        let limit = self.max_prompt_bytes();
        if bytes > limit {
            return Err(EngineError::BadRequest(format!(
                "the prompt is {bytes} bytes; the model's context length is {} tokens, so at most {limit} bytes \
                 of prompt are accepted",
                self.card.context_length
            )));
        }
        Ok(())
    }

    /// The prompt text of a chat request: the rendered template, or with
    /// `nvext.use_raw_prompt` the last user message as written. `tool_choice: none`
    /// renders no tools.
    pub fn render_chat(&self, request: &ChatCompletionRequest) -> Result<String, EngineError> {
        let tools = ToolRequest::from_request(request).map_err(EngineError::BadRequest)?;
        self.render_chat_with(request, tools.as_ref())
    }

    fn render_chat_with(&self, request: &ChatCompletionRequest, tools: Option<&ToolRequest>) -> Result<String, EngineError> {
        let raw = request.nvext.as_ref().and_then(|n| n.use_raw_prompt).unwrap_or(false);
        if raw {
            return request
                .messages
                .iter()
                .rev()
                .find(|m| m.role == "user")
                .map(|m| m.content.as_ref().map(|c| c.text()).unwrap_or_default())
                .ok_or_else(|| EngineError::BadRequest("use_raw_prompt needs a user message".to_string()));
        }
        let rendered_tools = match tools {
            Some(t) if t.choice != ToolChoice::None => request.tools.as_deref(),
            _ => None,
        };
        self.formatter
            .render_with(&request.messages, rendered_tools, request.chat_template_kwargs.as_ref())
            .map_err(|e| EngineError::BadRequest(e.to_string()))
    }

    /// How a chat request's output is parsed, and the engine constraint its tool
    /// choice needs; a 400 for tools the request or the model cannot serve.
    fn output_plan(
        &self,
        request: &ChatCompletionRequest,
        tools: Option<&ToolRequest>,
    ) -> Result<(OutputPlan, Option<serde_json::Value>), EngineError> {
        let mut plan = OutputPlan {
            reasoning_parser: self.card.reasoning_parser.clone(),
            thinking: request.enable_thinking(),
            ..Default::default()
        };
        let Some(tools) = tools else { return Ok((plan, None)) };
        let constrained = match &tools.choice {
            ToolChoice::None => return Ok((plan, None)),
            ToolChoice::Auto => {
                let Some(parser) = &self.card.tool_call_parser else {
                    return Err(EngineError::BadRequest(format!(
                        "tool_choice \"auto\" needs a tool-call parser, and model {} was registered without one \
                         (tool_call_parser: start its worker with --tool-call-parser NAME); \
                         tool_choice \"required\" or a named function work without it",
                        self.card.display_name
                    )));
                };
                plan.tool_parser = Some(parser.clone());
                plan.tool_names = tools.names();
                return Ok((plan, None));
            }
            ToolChoice::Required => ConstrainedCalls::List,
            ToolChoice::Named(name) => ConstrainedCalls::Named(name.clone()),
        };
        if request.response_format.as_ref().is_some_and(|f| *f != ResponseFormat::Text) {
            return Err(EngineError::BadRequest(
                "response_format cannot be combined with tool_choice \"required\" or a named function \
                 (both constrain the output)"
                    .to_string(),
            ));
        }
        let schema = tools.constraint();
        plan.constrained = Some(constrained);
        let format = serde_json::json!({
            "type": "json_schema",
            "json_schema": {"name": "tool_calls", "schema": schema, "strict": true},
            "compact": true,
        });
        Ok((plan, Some(format)))
    }

    /// Preprocess a chat request.
    pub fn preprocess_chat(&self, request: &ChatCompletionRequest) -> Result<Preprocessed, EngineError> {
        self.check_prompt_bytes(chat_input_bytes(request))?;
        let tools = ToolRequest::from_request(request).map_err(EngineError::BadRequest)?;
        let (output, tool_format) = self.output_plan(request, tools.as_ref())?;
        let formatted_prompt = self.render_chat_with(request, tools.as_ref())?;
        let raw = request.nvext.as_ref().and_then(|n| n.use_raw_prompt).unwrap_or(false);
        let token_ids = self.encode(&formatted_prompt, if raw { Specials::Add } else { Specials::FromTemplate })?;
        let limits = RequestLimits {
            max_tokens: request.max_tokens(),
            stop: request.stop.as_ref(),
            nvext: request.nvext.as_ref(),
            sampling: request.sampling.with_nvext(request.nvext.as_ref()),
            logprobs: request.wants_logprobs().then(|| request.top_logprobs.unwrap_or(0)),
            response_format: tool_format.or_else(|| client_format(request.response_format.as_ref())),
            keep_special_tokens: output.tool_parser.as_deref().is_some_and(needs_special_tokens),
        };
        Ok(Preprocessed { request: self.build(token_ids, limits)?, formatted_prompt, output })
    }

    /// Preprocess a completions request.
    pub fn preprocess_completion(&self, request: &CompletionRequest) -> Result<Preprocessed, EngineError> {
        self.check_prompt_bytes(completion_input_bytes(request))?;
        let (formatted_prompt, token_ids) = match &request.prompt {
            Prompt::Text(text) => (text.clone(), self.encode(text, Specials::Add)?),
            Prompt::TextList(list) => match list.as_slice() {
                [text] => (text.clone(), self.encode(text, Specials::Add)?),
                _ => {
                    return Err(EngineError::BadRequest(format!(
                        "prompt must be a string or a list of one string, got a list of {}",
                        list.len()
                    )))
                }
            },
            Prompt::Tokens(ids) => {
                let vocab = self.tokenizer.vocab_size();
                if let Some(bad) = ids.iter().find(|&&id| usize::try_from(id).map_or(true, |id| id >= vocab)) {
                    return Err(EngineError::BadRequest(format!(
                        "prompt token id {bad} is outside the vocabulary (size {vocab})"
                    )));
                }
                (String::new(), ids.clone())
            }
        };
        let limits = RequestLimits {
            max_tokens: request.max_tokens,
            stop: request.stop.as_ref(),
            nvext: request.nvext.as_ref(),
            sampling: request.sampling.with_nvext(request.nvext.as_ref()),
            logprobs: request.logprobs,
            response_format: client_format(request.response_format.as_ref()),
            keep_special_tokens: false,
        };
        Ok(Preprocessed { request: self.build(token_ids, limits)?, formatted_prompt, output: OutputPlan::default() })
    }

    fn encode(&self, text: &str, specials: Specials) -> Result<Vec<u32>, EngineError> {
        if text.len() > COUNT_FIRST_BYTES {
            self.refuse_if_far_too_long(text)?;
        }
        match specials {
            Specials::FromTemplate => self.tokenizer.encode(text, false),
            Specials::Add => self.tokenizer.encode_prompt(text, self.card.bos_token.as_deref()),
        }
        .map_err(|e| EngineError::Internal(e.to_string()))
    }

    /// Count a big prompt's tokens piece by piece (a piece's worth of tokenizer memory
    /// at a time) and refuse it as soon as the count is clearly past the context, before
    /// the whole prompt is tokenized at once. Pieces end after whitespace, so the count
    /// is close to the real one; the margin keeps a prompt that fits from being refused.
    fn refuse_if_far_too_long(&self, text: &str) -> Result<(), EngineError> {
        let context = usize::try_from(self.card.context_length).unwrap_or(usize::MAX);
        let refuse_above = context.saturating_add(context / 8).saturating_add(64);
        let mut count = 0usize;
        for piece in pieces(text, COUNT_PIECE_BYTES) {
            let ids = self.tokenizer.encode(piece, false).map_err(|e| EngineError::Internal(e.to_string()))?;
            count += ids.len();
            if count > refuse_above {
                return Err(EngineError::BadRequest(format!(
                    "the prompt is more than {count} tokens; the model's context length is {} tokens",
                    self.card.context_length
                )));
            }
        }
        Ok(())
    }

    fn build(&self, token_ids: Vec<u32>, limits: RequestLimits<'_>) -> Result<PreprocessedRequest, EngineError> {
        if token_ids.is_empty() {
            return Err(EngineError::BadRequest("the prompt is empty".to_string()));
        }
        let context_length = self.card.context_length;
        let prompt_len = u32::try_from(token_ids.len()).unwrap_or(u32::MAX);
        if prompt_len >= context_length {
            return Err(EngineError::BadRequest(format!(
                "the prompt is {prompt_len} tokens; the model's context length is {context_length} tokens, \
                 which leaves no room to generate"
            )));
        }
        // A larger max_tokens is clamped to what fits rather than refused: clients
        // (and dynamo-run's text mode) often send a generous fixed limit.
        let room = context_length - prompt_len;
        let max_tokens = limits.max_tokens.map_or(room, |m| m.min(room));

        let nvext = limits.nvext.cloned().unwrap_or_default();
        let sampling = limits.sampling;
        let ignore_eos = sampling.ignore_eos.unwrap_or(false);
        let eos_token_ids = if ignore_eos { Vec::new() } else { self.card.eos_token_ids.clone() };
        let stop =
            if ignore_eos { None } else { limits.stop.cloned().map(StopSpec::into_vec).filter(|s| !s.is_empty()) };
        let stop_conditions = StopConditions {
            max_tokens: Some(max_tokens),
            stop,
            stop_token_ids_hidden: (!eos_token_ids.is_empty()).then(|| eos_token_ids.clone()),
            min_tokens: sampling.min_tokens,
            ignore_eos: sampling.ignore_eos,
        };
        let sampling_options = SamplingOptions {
            n: sampling.n,
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            seed: sampling.seed,
            presence_penalty: sampling.presence_penalty,
            frequency_penalty: sampling.frequency_penalty,
            top_k: sampling.top_k,
            repetition_penalty: sampling.repetition_penalty,
            min_p: sampling.min_p,
            best_of: None,
        };
        Ok(PreprocessedRequest {
            token_ids,
            stop_conditions,
            sampling_options,
            eos_token_ids,
            mdc_sum: Some(self.mdc_sum.clone()),
            annotations: nvext.annotations.unwrap_or_default(),
            estimated_prefix_hit_num_blocks: None,
            output_options: OutputOptions { logprobs: limits.logprobs, keep_special_tokens: limits.keep_special_tokens },
            response_format: limits.response_format,
        })
    }
}

/// A client's `response_format` as the engine receives it.
fn client_format(format: Option<&ResponseFormat>) -> Option<serde_json::Value> {
    format.and_then(|f| serde_json::to_value(f).ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocols::openai::{ChatMessage, MessageContent};

    fn preprocessor(context_length: u32) -> Preprocessor {
        let card = ModelDeploymentCard::builtin("m").with_context_length(context_length).unwrap();
        Preprocessor::new(Arc::new(card)).unwrap()
    }

    fn chat(text: &str) -> ChatCompletionRequest {
        ChatCompletionRequest {
            model: "m".into(),
            messages: vec![ChatMessage {
                role: "user".into(),
                content: Some(MessageContent::Text(text.into())),
                name: None,
                tool_calls: None,
                tool_call_id: None,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn chat_sets_limits_stops_and_eos() {
        let p = preprocessor(100);
        let mut req = chat("hi");
        req.stop = Some(StopSpec::Many(vec!["END".into()]));
        req.sampling.temperature = Some(0.5);
        req.nvext = Some(NvExt { top_k: Some(4), min_tokens: Some(2), ..Default::default() });
        let out = p.preprocess_chat(&req).unwrap();
        assert_eq!(out.formatted_prompt, "<|user|>\nhi\n<|assistant|>\n");
        let r = out.request;
        // One token per byte with the builtin tokenizer.
        assert_eq!(r.token_ids.len(), out.formatted_prompt.len());
        assert_eq!(r.stop_conditions.max_tokens, Some(100 - r.token_ids.len() as u32));
        assert_eq!(r.stop_conditions.stop, Some(vec!["END".to_string()]));
        assert_eq!(r.stop_conditions.stop_token_ids_hidden, Some(vec![2]));
        assert_eq!(r.stop_conditions.min_tokens, Some(2));
        assert_eq!(r.eos_token_ids, vec![2]);
        assert_eq!(r.sampling_options.temperature, Some(0.5));
        assert_eq!(r.sampling_options.top_k, Some(4));
        assert_eq!(r.mdc_sum, Some(p.card().checksum()));
    }

    #[test]
    fn top_level_vllm_extensions_reach_the_engine_request_for_both_kinds() {
        let p = preprocessor(100);
        let fields = r#""temperature":0.5,"top_p":0.9,"n":1,"seed":7,"presence_penalty":0.1,"frequency_penalty":0.2,
            "top_k":5,"min_p":0.05,"repetition_penalty":1.1,"min_tokens":3,"ignore_eos":true"#;
        let chat: ChatCompletionRequest =
            serde_json::from_str(&format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],{fields}}}"#)).unwrap();
        let completion: CompletionRequest = serde_json::from_str(&format!(r#"{{"model":"m","prompt":"hi",{fields}}}"#)).unwrap();
        let expected = SamplingOptions {
            n: Some(1),
            best_of: None,
            presence_penalty: Some(0.1),
            frequency_penalty: Some(0.2),
            repetition_penalty: Some(1.1),
            temperature: Some(0.5),
            top_p: Some(0.9),
            top_k: Some(5),
            min_p: Some(0.05),
            seed: Some(7),
        };
        for r in [p.preprocess_chat(&chat).unwrap().request, p.preprocess_completion(&completion).unwrap().request] {
            assert_eq!(r.sampling_options, expected);
            assert_eq!(r.stop_conditions.min_tokens, Some(3));
            assert_eq!(r.stop_conditions.ignore_eos, Some(true));
            assert!(r.eos_token_ids.is_empty());
        }
    }

    #[test]
    fn max_tokens_is_clamped_to_the_context() {
        let p = preprocessor(100);
        let mut req = chat("hi");
        req.max_tokens = Some(10);
        assert_eq!(p.preprocess_chat(&req).unwrap().request.stop_conditions.max_tokens, Some(10));
        req.max_tokens = Some(1000);
        let r = p.preprocess_chat(&req).unwrap().request;
        assert_eq!(r.stop_conditions.max_tokens, Some(100 - r.token_ids.len() as u32));
    }

    #[test]
    fn ignore_eos_drops_eos_and_stops() {
        let p = preprocessor(100);
        let mut req = chat("hi");
        req.stop = Some(StopSpec::One("x".into()));
        req.nvext = Some(NvExt { ignore_eos: Some(true), ..Default::default() });
        let r = p.preprocess_chat(&req).unwrap().request;
        assert!(r.eos_token_ids.is_empty());
        assert_eq!(r.stop_conditions.stop, None);
        assert_eq!(r.stop_conditions.stop_token_ids_hidden, None);
        assert_eq!(r.stop_conditions.ignore_eos, Some(true));
    }

    #[test]
    fn context_overflow_is_a_bad_request() {
        let p = preprocessor(10);
        let e = p.preprocess_chat(&chat("a long enough message")).unwrap_err();
        assert!(matches!(&e, EngineError::BadRequest(m) if m.contains("context length is 10")), "{e:?}");
    }

    #[test]
    fn a_prompt_far_beyond_the_context_is_refused_by_size() {
        let p = preprocessor(10);
        let big = "x".repeat(10 * MAX_PROMPT_BYTES_PER_TOKEN + 1);
        let e = p.preprocess_chat(&chat(&big)).unwrap_err();
        assert!(matches!(&e, EngineError::BadRequest(m) if m.contains("bytes")), "{e:?}");
        let req = CompletionRequest { prompt: Prompt::Text(big), ..serde_json::from_str(r#"{"model":"m","prompt":""}"#).unwrap() };
        assert!(matches!(p.preprocess_completion(&req), Err(EngineError::BadRequest(m)) if m.contains("bytes")));
    }

    #[test]
    fn pieces_cover_the_text_and_end_after_whitespace() {
        let text = "ab cd éf gh ".repeat(1000);
        let parts: Vec<&str> = pieces(&text, 100).collect();
        assert_eq!(parts.concat(), text);
        assert!(parts[..parts.len() - 1].iter().all(|p| p.ends_with(' ') && p.len() <= 100));
        let solid = "é".repeat(200);
        assert_eq!(pieces(&solid, 101).collect::<Vec<_>>().concat(), solid);
    }

    #[test]
    fn a_big_prompt_past_the_context_is_refused_while_counting() {
        let p = preprocessor(200_000); // accepts up to 3.2 MB by size
        let big = "a ".repeat(COUNT_FIRST_BYTES); // 2 MiB: a token per byte, far past 200k
        let e = p.preprocess_completion(&CompletionRequest {
            prompt: Prompt::Text(big),
            ..serde_json::from_str(r#"{"model":"m","prompt":""}"#).unwrap()
        });
        assert!(matches!(e, Err(EngineError::BadRequest(m)) if m.contains("more than")));
    }

    #[test]
    fn completion_prompt_is_not_templated() {
        let p = preprocessor(100);
        let req: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":"abc","max_tokens":3}"#).unwrap();
        let out = p.preprocess_completion(&req).unwrap();
        assert_eq!(out.formatted_prompt, "abc");
        assert_eq!(p.tokenizer().decode(&out.request.token_ids, false).unwrap(), "abc");
        let req: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":[7,8]}"#).unwrap();
        assert_eq!(p.preprocess_completion(&req).unwrap().request.token_ids, vec![7, 8]);
        let req: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":[7,100000]}"#).unwrap();
        assert!(matches!(p.preprocess_completion(&req), Err(EngineError::BadRequest(m)) if m.contains("100000")));
    }

    #[test]
    fn raw_prompt_sends_the_last_user_message() {
        let p = preprocessor(100);
        let mut req = chat("just this");
        req.nvext = Some(NvExt { use_raw_prompt: Some(true), ..Default::default() });
        assert_eq!(p.preprocess_chat(&req).unwrap().formatted_prompt, "just this");
    }

    fn with_tools(card: ModelDeploymentCard, fields: &str) -> Result<Preprocessed, EngineError> {
        let req: ChatCompletionRequest = serde_json::from_str(&format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],
                "tools":[{{"type":"function","function":{{"name":"get_weather","parameters":{{"type":"object"}}}}}}]{fields}}}"#
        ))
        .unwrap();
        Preprocessor::new(Arc::new(card)).unwrap().preprocess_chat(&req)
    }

    fn tool_card(parser: Option<&str>) -> ModelDeploymentCard {
        let mut card = ModelDeploymentCard::builtin("m");
        card.chat_template = Some("{% if tools %}T{{ tools | length }} {% endif %}{{ messages[0].content }}".into());
        card.tool_call_parser = parser.map(String::from);
        card
    }

    #[test]
    fn auto_needs_the_models_tool_call_parser_and_required_does_not() {
        let e = with_tools(tool_card(None), "").unwrap_err();
        assert!(matches!(&e, EngineError::BadRequest(m) if m.contains("tool_call_parser") && m.contains("--tool-call-parser")), "{e:?}");
        let out = with_tools(tool_card(Some("hermes")), "").unwrap();
        assert_eq!(out.formatted_prompt, "T1 hi");
        assert_eq!(out.output.tool_parser.as_deref(), Some("hermes"));
        assert_eq!(out.output.tool_names, vec!["get_weather".to_string()]);
        assert_eq!(out.request.response_format, None);
        assert!(!out.request.output_options.keep_special_tokens);
        // Markup made of special tokens: the detokenizer keeps them.
        let out = with_tools(tool_card(Some("mistral")), "").unwrap();
        assert!(out.request.output_options.keep_special_tokens);

        let out = with_tools(tool_card(None), r#","tool_choice":"required""#).unwrap();
        assert_eq!(out.output.constrained, Some(ConstrainedCalls::List));
        let format = out.request.response_format.unwrap();
        assert_eq!((format["type"].as_str(), format["compact"].as_bool()), (Some("json_schema"), Some(true)));
        assert_eq!(format["json_schema"]["schema"]["minItems"], 1);
        let named = r#","tool_choice":{"type":"function","function":{"name":"get_weather"}}"#;
        let out = with_tools(tool_card(None), named).unwrap();
        assert_eq!(out.output.constrained, Some(ConstrainedCalls::Named("get_weather".into())));
        assert_eq!(out.request.response_format.unwrap()["json_schema"]["schema"], serde_json::json!({"type": "object"}));
        let e = with_tools(tool_card(None), &format!(r#"{named},"response_format":{{"type":"json_object"}}"#)).unwrap_err();
        assert!(matches!(&e, EngineError::BadRequest(m) if m.contains("response_format")), "{e:?}");
    }

    #[test]
    fn tool_choice_none_renders_no_tools_and_parses_nothing_but_reasoning() {
        let mut card = tool_card(None);
        card.reasoning_parser = Some("qwen3".into());
        let out = with_tools(card, r#","tool_choice":"none","chat_template_kwargs":{"enable_thinking":false}"#).unwrap();
        assert_eq!(out.formatted_prompt, "hi");
        assert_eq!(out.output.tool_parser, None);
        assert_eq!((out.output.reasoning_parser.as_deref(), out.output.thinking), (Some("qwen3"), false));
        assert_eq!(out.request.response_format, None);
    }

    #[test]
    fn template_errors_are_bad_requests() {
        let mut card = ModelDeploymentCard::builtin("m");
        card.chat_template = Some("{{ raise_exception('no system role') }}".into());
        let p = Preprocessor::new(Arc::new(card)).unwrap();
        let e = p.preprocess_chat(&chat("x")).unwrap_err();
        assert!(matches!(&e, EngineError::BadRequest(m) if m.contains("no system role")), "{e:?}");
    }
}

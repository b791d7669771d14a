//! The token-level protocol between a frontend (preprocessor) and a token engine
//! (`echo_core`, `mocker`, a Python worker registered as `backend`). JSON on the wire;
//! a Python worker receives a `PreprocessedRequest` dict and yields
//! `{"token_ids": [...], "finish_reason": "stop"}`-shaped dicts.

use serde::{Deserialize, Serialize};

/// When generation must end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StopConditions {
    /// Most tokens to generate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Stop strings (matched by the detokenizer on text; never emitted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// Token ids that end generation and are not emitted (besides `eos_token_ids`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_token_ids_hidden: Option<Vec<u32>>,
    /// Fewest tokens to generate before an EOS or stop may end the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tokens: Option<u32>,
    /// Generate until `max_tokens` whatever the engine's EOS says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
}

/// Sampling options passed through to the engine untouched.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_of: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

/// A tokenized request, ready for a token engine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PreprocessedRequest {
    /// The prompt's token ids.
    pub token_ids: Vec<u32>,
    #[serde(default)]
    pub stop_conditions: StopConditions,
    #[serde(default)]
    pub sampling_options: SamplingOptions,
    /// The model's end-of-sequence ids (empty when `ignore_eos`).
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
    /// Checksum of the model card the frontend used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mdc_sum: Option<String>,
    /// Annotations the client asked for (`nvext.annotations`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub annotations: Vec<String>,
    /// Prefix blocks the router expects the chosen worker to have cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_prefix_hit_num_blocks: Option<u32>,
    /// What the client asked to get back besides tokens.
    #[serde(default, skip_serializing_if = "OutputOptions::is_default")]
    pub output_options: OutputOptions,
    /// The client's `response_format` (`json_object`, `json_schema`), validated in
    /// shape, or the JSON schema of the calls `tool_choice: required` / a named function
    /// asks for, which also carries `"compact": true`: generate the JSON without
    /// optional whitespace (a weak model would otherwise pad with it until
    /// `max_tokens`). An engine that cannot constrain its output ignores it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<serde_json::Value>,
}

/// Extra output a client asked for.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OutputOptions {
    /// Return each generated token's log probability (`log_probs`) and this many
    /// alternatives per token (`top_log_probs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// Keep special tokens in the detokenized text (the request's output is parsed for
    /// markup made of special tokens, e.g. `[TOOL_CALLS]`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep_special_tokens: bool,
}

impl OutputOptions {
    fn is_default(&self) -> bool {
        self == &OutputOptions::default()
    }
}

/// An alternative token and its log probability.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopLogprob {
    pub token_id: u32,
    pub logprob: f64,
}

/// Why a stream ended. JSON: `"eos"`, `"length"`, `"stop"`, `"cancelled"`, or
/// `{"error": "message"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The engine produced an end-of-sequence token.
    Eos,
    /// `max_tokens` (or the context length) was reached.
    Length,
    /// A stop string or stop token matched.
    Stop,
    /// The request was cancelled.
    Cancelled,
    /// The engine failed.
    Error(String),
}

impl FinishReason {
    /// The OpenAI `finish_reason` string (`eos` and `stop` are both `"stop"`).
    pub fn as_openai(&self) -> &'static str {
        match self {
            FinishReason::Eos | FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length => "length",
            FinishReason::Error(_) => "error",
        }
    }
}

/// One step of a token engine's output.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LLMEngineOutput {
    /// New token ids in this step (may be empty on the final item).
    #[serde(default)]
    pub token_ids: Vec<u32>,
    /// The tokens as strings, when the engine knows them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<String>>,
    /// The decoded text of this step, when the engine decodes itself (skips the
    /// detokenizer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cum_log_probs: Option<f64>,
    /// Log probability of each of `token_ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_probs: Option<Vec<f64>>,
    /// Most likely alternatives for each of `token_ids`, most likely first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_log_probs: Option<Vec<Vec<TopLogprob>>>,
    /// Set on the last item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// Prompt tokens the engine found in its prefix cache (on an item of the stream,
    /// typically the first), when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_reason_json() {
        assert_eq!(serde_json::to_string(&FinishReason::Stop).unwrap(), "\"stop\"");
        assert_eq!(serde_json::to_string(&FinishReason::Error("x".into())).unwrap(), "{\"error\":\"x\"}");
        let out: LLMEngineOutput = serde_json::from_str(r#"{"token_ids":[1,2],"finish_reason":"length"}"#).unwrap();
        assert_eq!(out.token_ids, vec![1, 2]);
        assert_eq!(out.finish_reason, Some(FinishReason::Length));
    }

    #[test]
    fn preprocessed_request_minimal_json() {
        let req: PreprocessedRequest = serde_json::from_str(r#"{"token_ids":[5]}"#).unwrap();
        assert_eq!(req.token_ids, vec![5]);
        assert_eq!(req.stop_conditions, StopConditions::default());
    }
}

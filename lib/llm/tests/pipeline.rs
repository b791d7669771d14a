//! The preprocessor pipeline end to end: OpenAI request → template → tokens → token
//! engine → detokenizer → OpenAI chunks, with the echo engines and with a model card
//! read from a HuggingFace-style folder written by the test.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;

use dynamo_llm::aggregate::{ChatAggregator, CompletionAggregator};
use dynamo_llm::engine::{EngineError, OpenAIEngine, RequestContext, TokenEngine, TokenStream};
use dynamo_llm::engines::{EchoCore, EchoFull};
use dynamo_llm::model_card::{ModelDeploymentCard, ModelKind};
use dynamo_llm::pipeline::Pipeline;
use dynamo_llm::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use dynamo_llm::protocols::openai::{ChatCompletionRequest, CompletionRequest, Usage};

const LIMIT: Duration = Duration::from_secs(10);

fn chat_request(json: &str) -> ChatCompletionRequest {
    serde_json::from_str(json).unwrap()
}

fn echo_core_pipeline(card: ModelDeploymentCard) -> Pipeline {
    Pipeline::new(Arc::new(card), Arc::new(EchoCore::new(Duration::ZERO))).unwrap()
}

#[tokio::test]
async fn echo_core_returns_the_templated_prompt() {
    let pipeline = echo_core_pipeline(ModelDeploymentCard::builtin("echo"));
    let req = chat_request(r#"{"model":"echo","messages":[{"role":"user","content":"héllo 🦀 世界"}]}"#);
    let stream = pipeline.chat(req, RequestContext::new("r")).await.unwrap();
    let items: Vec<_> = tokio::time::timeout(LIMIT, stream.collect::<Vec<_>>()).await.unwrap();
    let items: Vec<_> = items.into_iter().map(Result::unwrap).collect();

    let first = &items[0];
    assert!(first.data.id.starts_with("chatcmpl-"));
    assert_eq!(first.data.model, "echo");
    assert_eq!(first.data.choices[0].delta.role.as_deref(), Some("assistant"));
    let prompt = "<|user|>\nhéllo 🦀 世界\n<|assistant|>\n";
    assert_eq!(first.prompt_tokens, Some(prompt.len() as u32));
    assert!(items[1..].iter().all(|i| i.prompt_tokens.is_none() && i.data.choices[0].delta.role.is_none()));

    let text: String = items.iter().filter_map(|i| i.data.choices[0].delta.content.clone()).collect();
    assert_eq!(text, prompt);
    let last = items.last().unwrap();
    assert_eq!(last.data.choices[0].finish_reason.as_deref(), Some("stop"));
    assert!(items[..items.len() - 1].iter().all(|i| i.data.choices[0].finish_reason.is_none()));
    // One token per byte, all accounted for.
    assert_eq!(items.iter().map(|i| i.completion_tokens).sum::<u32>(), prompt.len() as u32);
}

#[tokio::test]
async fn fold_gives_the_whole_response_with_usage() {
    let pipeline = echo_core_pipeline(ModelDeploymentCard::builtin("echo"));
    let req = chat_request(r#"{"model":"echo","messages":[{"role":"user","content":"hi"}],"max_tokens":5}"#);
    let stream = pipeline.chat(req, RequestContext::new("r")).await.unwrap();
    let response = tokio::time::timeout(LIMIT, ChatAggregator::new("r", "m").fold(stream)).await.unwrap().unwrap();
    assert_eq!(response.object, "chat.completion");
    assert_eq!(response.choices[0].message.content.as_deref(), Some("<|use"));
    assert_eq!(response.choices[0].finish_reason.as_deref(), Some("length"));
    let prompt_len = "<|user|>\nhi\n<|assistant|>\n".len() as u32;
    assert_eq!(response.usage, Usage::new(prompt_len, 5));

    let req: CompletionRequest =
        serde_json::from_str(r#"{"model":"echo","prompt":"one two. three","stop":". "}"#).unwrap();
    let stream = pipeline.completion(req, RequestContext::new("r")).await.unwrap();
    let response = tokio::time::timeout(LIMIT, CompletionAggregator::new("r", "m").fold(stream)).await.unwrap().unwrap();
    assert!(response.id.starts_with("cmpl-"));
    assert_eq!(response.choices[0].text, "one two");
    assert_eq!(response.choices[0].finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.usage.unwrap().prompt_tokens, 14);
}

#[tokio::test]
async fn echo_full_echoes_and_folds() {
    let engine = EchoFull::new(Duration::ZERO);
    let req = chat_request(
        r#"{"model":"m","messages":[{"role":"user","content":"first"},{"role":"assistant","content":"x"},{"role":"user","content":"last one"}]}"#,
    );
    let stream = engine.chat(req, RequestContext::new("r")).await.unwrap();
    let response = tokio::time::timeout(LIMIT, ChatAggregator::new("r", "m").fold(stream)).await.unwrap().unwrap();
    assert_eq!(response.choices[0].message.content.as_deref(), Some("last one"));
    assert_eq!(response.choices[0].finish_reason.as_deref(), Some("stop"));
    assert_eq!(response.usage.completion_tokens, 8);
}

#[tokio::test]
async fn a_stopped_context_ends_echo_streams() {
    // Through the pipeline: the engine sees the stop and finishes with `cancelled`.
    let pipeline = Pipeline::new(
        Arc::new(ModelDeploymentCard::builtin("echo")),
        Arc::new(EchoCore::new(Duration::from_millis(5))),
    )
    .unwrap();
    let ctx = RequestContext::new("r");
    let req = chat_request(
        r#"{"model":"echo","messages":[{"role":"user","content":"a fairly long message to echo back slowly"}]}"#,
    );
    let mut stream = pipeline.chat(req, ctx.clone()).await.unwrap();
    let first = tokio::time::timeout(LIMIT, stream.next()).await.unwrap().unwrap().unwrap();
    assert!(first.data.choices[0].finish_reason.is_none());
    ctx.stop_generating();
    let rest: Vec<_> = tokio::time::timeout(LIMIT, stream.collect::<Vec<_>>()).await.unwrap();
    let last = rest.last().unwrap().as_ref().unwrap();
    assert_eq!(last.data.choices[0].finish_reason.as_deref(), Some(FinishReason::Cancelled.as_openai()));
    let text: String = rest.iter().filter_map(|i| i.as_ref().unwrap().data.choices[0].delta.content.clone()).collect();
    assert!(text.len() < 20, "the echo went on after the stop: {text:?}");

    // echo_full, killed: the stream just ends.
    let ctx = RequestContext::new("r2");
    let req = chat_request(r#"{"model":"m","messages":[{"role":"user","content":"abcdefghijklmnop"}]}"#);
    let mut stream = EchoFull::new(Duration::from_secs(3600)).chat(req, ctx.clone()).await.unwrap();
    ctx.kill();
    assert!(tokio::time::timeout(LIMIT, stream.next()).await.unwrap().is_none());
}

#[tokio::test]
async fn context_overflow_is_a_bad_request() {
    let card = ModelDeploymentCard::builtin("echo").with_context_length(16).unwrap();
    let pipeline = echo_core_pipeline(card);
    let req = chat_request(r#"{"model":"echo","messages":[{"role":"user","content":"this does not fit"}]}"#);
    let err = pipeline.chat(req, RequestContext::new("r")).await.err().unwrap();
    assert_eq!(err.status(), 400);
    assert!(err.to_string().contains("context length"), "{err}");
}

/// Replays the items it was built with, whatever the request.
struct ScriptedEngine(Vec<Result<LLMEngineOutput, EngineError>>);

#[async_trait]
impl TokenEngine for ScriptedEngine {
    async fn generate(&self, _request: PreprocessedRequest, _ctx: RequestContext) -> Result<TokenStream, EngineError> {
        Ok(futures::stream::iter(self.0.clone()).boxed())
    }
}

async fn scripted_completion(items: Vec<Result<LLMEngineOutput, EngineError>>) -> Vec<Result<String, EngineError>> {
    let pipeline = Pipeline::new(Arc::new(ModelDeploymentCard::builtin("m")), Arc::new(ScriptedEngine(items))).unwrap();
    let req: CompletionRequest = serde_json::from_str(r#"{"model":"m","prompt":"xyz"}"#).unwrap();
    let stream = pipeline.completion(req, RequestContext::new("r")).await.unwrap();
    let items = tokio::time::timeout(LIMIT, stream.collect::<Vec<_>>()).await.unwrap();
    items.into_iter().map(|r| r.map(|i| i.data.choices[0].text.clone())).collect()
}

#[tokio::test]
async fn an_engine_error_mid_stream_becomes_an_err_item() {
    let x_id = ModelDeploymentCard::builtin("m").tokenizer().unwrap().encode("x", false).unwrap();
    let x = LLMEngineOutput { token_ids: x_id, ..Default::default() };
    let items = scripted_completion(vec![Ok(x.clone()), Err(EngineError::Internal("worker lost".into()))]).await;
    assert_eq!(items, vec![Ok("x".to_string()), Err(EngineError::Internal("worker lost".into()))]);

    let failed =
        LLMEngineOutput { finish_reason: Some(FinishReason::Error("out of memory".into())), ..Default::default() };
    let items = scripted_completion(vec![Ok(x), Ok(failed)]).await;
    assert_eq!(items, vec![Ok("x".to_string()), Err(EngineError::Internal("out of memory".into()))]);
}

/// A tiny HuggingFace-style model folder: a WordLevel tokenizer, a tokenizer config
/// with a named chat template list, and a config.
fn write_hf_dir(root: &std::path::Path) -> std::path::PathBuf {
    let dir = root.join("tiny-words");
    std::fs::create_dir(&dir).unwrap();
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
            "normalized": false, "special": true})
    };
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "unk_token": "<unk>",
            "vocab": {"<unk>": 0, "<s>": 1, "</s>": 2, "user:": 3, "hello": 4, "world": 5, "assistant:": 6}}
    });
    let template = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let tokenizer_config = serde_json::json!({
        "bos_token": "<s>",
        "eos_token": {"content": "</s>", "lstrip": false},
        "model_max_length": 1e30,
        "chat_template": [{"name": "default", "template": template}, {"name": "tool_use", "template": "tools!"}]
    });
    let config = serde_json::json!({"max_position_embeddings": 64, "eos_token_id": 2});
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    std::fs::write(dir.join("tokenizer_config.json"), tokenizer_config.to_string()).unwrap();
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

#[tokio::test]
async fn card_from_a_hf_folder_serves_through_the_pipeline() {
    let root = tempfile::tempdir().unwrap();
    let dir = write_hf_dir(root.path());
    let card = ModelDeploymentCard::from_hf_dir(&dir, None).unwrap();
    assert_eq!(card.display_name, "tiny-words");
    assert_eq!(card.kind, ModelKind::Backend);
    assert_eq!(card.context_length, 64);
    assert_eq!(card.kv_cache_block_size, 16);
    assert_eq!(card.eos_token_ids, vec![2]);
    assert_eq!(card.eos_token.as_deref(), Some("</s>"));
    assert_eq!(card.tool_use_template.as_deref(), Some("tools!"));
    let named = ModelDeploymentCard::from_hf_dir(&dir, Some("other")).unwrap();
    assert_eq!(named.display_name, "other");

    // The card travels as JSON with the tokenizer inside.
    let shipped: ModelDeploymentCard = serde_json::from_str(&serde_json::to_string(&card).unwrap()).unwrap();
    drop(root);
    let pipeline = echo_core_pipeline(shipped);
    let prompt = pipeline
        .preprocessor()
        .render_chat(&chat_request(r#"{"model":"tiny-words","messages":[{"role":"user","content":"hello world"}]}"#))
        .unwrap();
    assert_eq!(prompt, "<s>user: hello world assistant:");

    let req = chat_request(r#"{"model":"tiny-words","messages":[{"role":"user","content":"hello world"}]}"#);
    let stream = pipeline.chat(req, RequestContext::new("r")).await.unwrap();
    let response = tokio::time::timeout(LIMIT, ChatAggregator::new("r", "m").fold(stream)).await.unwrap().unwrap();
    // The BOS is not doubled, and special tokens are not echoed as text. The echo
    // continues the prompt, so its first word is decoded after it: with a space.
    assert_eq!(response.usage.prompt_tokens, 5);
    assert_eq!(response.choices[0].message.content.as_deref(), Some(" user: hello world assistant:"));
}

/// Manual check with the real TinyLlama tokenizer (needs /work/shared): streaming
/// detokenization gives exactly what decoding the whole text at once gives (the echo
/// continues the prompt: it is what the prompt twice adds to the prompt once).
#[tokio::test]
#[ignore]
async fn tinyllama_echo_core() {
    let card = ModelDeploymentCard::from_hf_dir("/work/shared/models/tinyllama-chat", None).unwrap();
    let pipeline = echo_core_pipeline(card);
    let req = chat_request(
        r#"{"model":"tinyllama-chat","messages":[{"role":"user","content":"Héllo 🦀 wörld, 世界! 😀 ab"}],"nvext":{"ignore_eos":true}}"#,
    );
    let pre = pipeline.preprocessor().preprocess_chat(&req).unwrap();
    let tokenizer = pipeline.preprocessor().tokenizer();
    let whole = tokenizer.decode(&pre.request.token_ids, true).unwrap();
    let twice = tokenizer.decode(&[pre.request.token_ids.clone(), pre.request.token_ids.clone()].concat(), true).unwrap();
    let stream = pipeline.chat(req, RequestContext::new("r")).await.unwrap();
    let response = tokio::time::timeout(LIMIT, ChatAggregator::new("r", "m").fold(stream)).await.unwrap().unwrap();
    assert_eq!(response.choices[0].message.content.as_deref(), twice.strip_prefix(whole.as_str()));
    assert!(whole.contains("Héllo 🦀 wörld, 世界! 😀 ab"), "{whole:?}");
}

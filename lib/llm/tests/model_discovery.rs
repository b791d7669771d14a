//! Model registration and discovery end to end: worker runtimes register models, a
//! frontend runtime's `ModelWatcher` fills the HTTP service's model manager, requests
//! travel over the TCP request plane. All runtimes share an in-memory discovery store.

use crate::common;
use crate::poll;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use common::*;
use dynamo_llm::discovery::{register_model, unregister_model, ModelKind, ModelRegistration, MODELS_PREFIX};
use dynamo_llm::engine::EngineFactory;
use dynamo_llm::frontend::{ModelWatcher, ModelWatcherHandle};
use dynamo_llm::remote::{serve_openai_engine, serve_token_engine};
use dynamo_llm::routing::RouterMode;
use dynamo_llm::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext, StreamItem, TokenEngine,
};
use dynamo_llm::http::{HttpService, RunningHttpService};
use dynamo_llm::model_manager::ModelManager;
use dynamo_llm::protocols::common::PreprocessedRequest;
use dynamo_llm::protocols::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, CompletionChoice, CompletionRequest,
    CompletionResponse, Prompt,
};
use dynamo_runtime::config::{DiscoveryBackend, RuntimeConfig};
use dynamo_runtime::discovery::MemStore;
use dynamo_runtime::DistributedRuntime;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

fn config() -> RuntimeConfig {
    RuntimeConfig { discovery: DiscoveryBackend::Mem, shutdown_timeout: Duration::from_secs(1), ..Default::default() }
}

async fn runtime(store: &Arc<MemStore>) -> DistributedRuntime {
    DistributedRuntime::with_mem_store(config(), store.clone()).await.unwrap()
}

/// Decoded steps: (text, finish reason, prompt tokens).
type CharSteps = futures::stream::BoxStream<'static, Result<(String, Option<String>, u32), EngineError>>;

/// A stand-in for the preprocessor pipeline: characters are tokens (`wait` is the
/// single token 0); the output tokens become characters again.
struct CharPipeline {
    tokens: Arc<dyn TokenEngine>,
}

impl CharPipeline {
    fn encode(text: &str) -> Vec<u32> {
        if text == "wait" {
            vec![0]
        } else {
            text.chars().map(u32::from).collect()
        }
    }

    async fn run(&self, text: String, ctx: RequestContext) -> Result<CharSteps, EngineError> {
        let token_ids = Self::encode(&text);
        let prompt = token_ids.len() as u32;
        let stream = self.tokens.generate(PreprocessedRequest { token_ids, ..Default::default() }, ctx).await?;
        Ok(stream
            .map(move |out| {
                let out = out?;
                let text: String = out.token_ids.iter().filter_map(|t| char::from_u32(*t)).collect();
                Ok((text, out.finish_reason.map(|f| f.as_openai().to_string()), prompt))
            })
            .boxed())
    }
}

#[async_trait]
impl OpenAIEngine for CharPipeline {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        let text = request.messages.last().and_then(|m| m.content.as_ref()).map(|c| c.text()).unwrap_or_default();
        let (id, model) = (ctx.id().to_string(), request.model.clone());
        let mut first = true;
        Ok(self
            .run(text, ctx)
            .await?
            .map(move |step| {
                let (text, finish, prompt) = step?;
                let tokens = text.chars().count() as u32;
                let delta = ChatDelta { content: Some(text), ..Default::default() };
                let chunk = ChatCompletionChunk::new(&id, &model, 1, ChatChunkChoice { index: 0, delta, finish_reason: finish, logprobs: None });
                let prompt_tokens = std::mem::replace(&mut first, false).then_some(prompt);
                Ok(StreamItem { data: chunk, prompt_tokens, completion_tokens: tokens, cached_tokens: None })
            })
            .boxed())
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        let Prompt::Text(text) = request.prompt else { return Err(EngineError::BadRequest("text prompts only".into())) };
        let (id, model) = (ctx.id().to_string(), request.model.clone());
        Ok(self
            .run(text, ctx)
            .await?
            .map(move |step| {
                let (text, finish_reason, _) = step?;
                let chunk = CompletionResponse::new(&id, &model, 1, CompletionChoice { index: 0, text, finish_reason, logprobs: None });
                Ok(StreamItem::new(chunk))
            })
            .boxed())
    }
}

struct Frontend {
    runtime: DistributedRuntime,
    http: RunningHttpService,
    addr: std::net::SocketAddr,
    watcher: ModelWatcherHandle,
    cards: Arc<Mutex<Vec<serde_json::Value>>>,
}

async fn frontend(store: &Arc<MemStore>) -> Frontend {
    let runtime = runtime(store).await;
    let manager = Arc::new(ModelManager::new());
    let http = HttpService::builder().host("127.0.0.1").port(0).manager(manager.clone()).build().unwrap();
    let http = http.spawn(CancellationToken::new()).await.unwrap();
    let cards = Arc::new(Mutex::new(Vec::new()));
    let seen = cards.clone();
    let factory: EngineFactory = Arc::new(move |card: serde_json::Value, tokens: Arc<dyn TokenEngine>| {
        if card["refuse"] == true {
            return Err("this card is refused".to_string());
        }
        seen.lock().unwrap().push(card);
        Ok(Arc::new(CharPipeline { tokens }) as Arc<dyn OpenAIEngine>)
    });
    let watcher = ModelWatcher::new(runtime.clone(), manager, RouterMode::RoundRobin, factory)
        .with_card_timeout(Duration::from_millis(500))
        .start(CancellationToken::new())
        .await
        .unwrap();
    let addr = http.local_addr();
    Frontend { runtime, http, addr, watcher, cards }
}

impl Frontend {
    async fn shutdown(self) {
        self.watcher.stop().await;
        self.http.shutdown().await.unwrap();
        self.runtime.shutdown().await;
    }
}

/// Wait until `/v1/models` lists exactly `expected`.
async fn wait_for_models(addr: std::net::SocketAddr, expected: &[&str]) {
    poll::eventually(&format!("/v1/models is {expected:?}"), WAIT, async || {
        let json = get(addr, "/v1/models").await.json();
        let ids: Vec<String> = json["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect();
        (ids == expected).then_some(())
    })
    .await;
}

/// A worker serving a [`ScriptEngine`] as a chat model `name` on `ns.{component}.generate`.
async fn chat_worker(store: &Arc<MemStore>, component: &str, name: &str) -> (DistributedRuntime, mpsc::UnboundedReceiver<EngineEvent>) {
    let rt = runtime(store).await;
    let (engine, events) = ScriptEngine::new();
    let endpoint = rt.namespace("ns").unwrap().component(component).unwrap().endpoint("generate").unwrap();
    serve_openai_engine(&endpoint, engine).await.unwrap();
    register_model(&endpoint, ModelRegistration::new(name, ModelKind::Chat), None).await.unwrap();
    (rt, events)
}

/// A worker serving an [`EchoTokenEngine`] as a backend model `name`, with `card`.
async fn token_worker(store: &Arc<MemStore>, name: &str, card: serde_json::Value) -> (DistributedRuntime, mpsc::UnboundedReceiver<String>) {
    let rt = runtime(store).await;
    let (tx, rx) = mpsc::unbounded_channel();
    let endpoint = rt.namespace("ns").unwrap().component("backend").unwrap().endpoint("generate").unwrap();
    serve_token_engine(&endpoint, Arc::new(EchoTokenEngine { stopped: tx })).await.unwrap();
    let mut registration = ModelRegistration::new(name, ModelKind::Backend);
    registration.context_length = Some(128);
    register_model(&endpoint, registration, Some(card)).await.unwrap();
    (rt, rx)
}

fn events_content(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .filter_map(|e| {
            let v: serde_json::Value = serde_json::from_str(e).unwrap();
            v["choices"].get(0).and_then(|c| c["delta"]["content"].as_str()).map(String::from)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_come_and_go_with_their_workers() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    assert_eq!(get(f.addr, "/health").await.status, 503);
    wait_for_models(f.addr, &[]).await;

    let (chat_rt, _events) = chat_worker(&store, "chat", "chat-model").await;
    wait_for_models(f.addr, &["chat-model"]).await;
    let health = get(f.addr, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["models"], serde_json::json!(["chat-model"]));

    // Streaming through the remote engine: chunks, token counts, [DONE].
    let mut body = chat_body("chat-model", "over the wire", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(serde_json::to_vec(&body).unwrap()))).await;
    assert_eq!(response.status, 200);
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events_content(&events), "over the wire ");
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"], serde_json::json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}));
    // A chat model is an OpenAI engine: it serves completions too.
    let resp = post(f.addr, "/v1/completions", &serde_json::json!({"model": "chat-model", "prompt": "both routes"})).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["choices"][0]["text"], "both routes ");

    // A backend model: the frontend fetches its (large) card and builds the pipeline.
    let card = serde_json::json!({"display_name": "token-model", "tokenizer": "t".repeat(2 * 1024 * 1024)});
    let (token_rt, _stops) = token_worker(&store, "token-model", card).await;
    wait_for_models(f.addr, &["chat-model", "token-model"]).await;
    {
        let cards = f.cards.lock().unwrap();
        assert_eq!(cards.len(), 1);
        assert_eq!(cards[0]["tokenizer"].as_str().map(str::len), Some(2 * 1024 * 1024));
    }
    let resp = post(f.addr, "/v1/chat/completions", &chat_body("token-model", "abc", false)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["choices"][0]["message"]["content"], "abc");
    assert_eq!(json["choices"][0]["finish_reason"], "stop");
    assert_eq!(json["usage"], serde_json::json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}));
    let resp = post(f.addr, "/v1/completions", &serde_json::json!({"model": "token-model", "prompt": "xy"})).await;
    assert_eq!(resp.json()["choices"][0]["text"], "xy");

    // The chat worker goes away: its model goes; the other stays.
    chat_rt.shutdown().await;
    wait_for_models(f.addr, &["token-model"]).await;
    let gone = post(f.addr, "/v1/chat/completions", &chat_body("chat-model", "hi", false)).await;
    assert_eq!(gone.status, 404, "{}", gone.body);

    // Deregistering (without dying) removes the model too.
    let endpoint = token_rt.namespace("ns").unwrap().component("backend").unwrap().endpoint("generate").unwrap();
    unregister_model(&endpoint).await.unwrap();
    wait_for_models(f.addr, &[]).await;
    assert_eq!(get(f.addr, "/health").await.status, 503);
    token_rt.shutdown().await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_without_instances_is_unlisted_and_answers_503() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let (worker, _events) = chat_worker(&store, "chat", "m").await;
    wait_for_models(f.addr, &["m"]).await;

    // The instance disappears while its model entry stays.
    let endpoint = worker.namespace("ns").unwrap().component("chat").unwrap().endpoint("generate").unwrap();
    let instance_key = format!("{}{:x}", endpoint.id().instances_prefix(), worker.instance_id());
    worker.discovery().delete(&instance_key).await.unwrap();
    wait_for_models(f.addr, &[]).await;
    assert_eq!(get(f.addr, "/health").await.status, 503);
    let resp = post(f.addr, "/v1/chat/completions", &chat_body("m", "hello", true)).await;
    assert_eq!(resp.status, 503, "{}", resp.body);
    assert_eq!(resp.json()["error"]["type"], "service_unavailable");
    worker.shutdown().await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_errors_cross_the_wire_with_their_status() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let (worker, _events) = chat_worker(&store, "chat", "m").await;
    wait_for_models(f.addr, &["m"]).await;

    let bad = post(f.addr, "/v1/chat/completions", &chat_body("m", "bad", false)).await;
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["message"], "the engine refuses this");
    let unavailable = post(f.addr, "/v1/chat/completions", &chat_body("m", "unavailable", true)).await;
    assert_eq!(unavailable.status, 503, "{}", unavailable.body);

    let body = serde_json::to_vec(&chat_body("m", "fail", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let error: serde_json::Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(error["error"]["message"], "engine exploded");
    worker.shutdown().await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_stream_without_a_finish_reason_is_an_error_not_a_stop() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let (worker, _events) = chat_worker(&store, "chat", "m").await;
    wait_for_models(f.addr, &["m"]).await;

    let body = serde_json::to_vec(&chat_body("m", "truncate", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.len(), 2, "a chunk, then an error event, and no [DONE]: {events:?}");
    let error: serde_json::Value = serde_json::from_str(&events[1]).unwrap();
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("without a finish reason"), "{message}");

    let whole = post(f.addr, "/v1/chat/completions", &chat_body("m", "truncate", false)).await;
    assert_eq!(whole.status, 500, "{}", whole.body);
    worker.shutdown().await;
    f.shutdown().await;
}

async fn expect_stopped(events: &mut mpsc::UnboundedReceiver<EngineEvent>) {
    loop {
        match bounded("the worker's engine to see the stop", events.recv()).await {
            Some(EngineEvent::Stopped(_)) => return,
            Some(EngineEvent::Started(_)) => continue,
            None => panic!("engine gone"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_disconnect_stops_the_remote_engine() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let (chat_rt, mut events) = chat_worker(&store, "chat", "chat-model").await;
    let (token_rt, mut stops) = token_worker(&store, "token-model", serde_json::json!({})).await;
    wait_for_models(f.addr, &["chat-model", "token-model"]).await;

    // Streaming, OpenAI-level remote engine.
    let body = serde_json::to_vec(&chat_body("chat-model", "wait", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    assert!(bounded("first event", response.next_event()).await.unwrap().contains("waiting"));
    drop(response);
    expect_stopped(&mut events).await;

    // Unary, OpenAI-level remote engine.
    let addr = f.addr;
    let client = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body("chat-model", "wait", false)).await });
    assert_eq!(bounded("request", events.recv()).await, Some(EngineEvent::Started("wait".into())));
    client.abort();
    let _ = client.await;
    expect_stopped(&mut events).await;

    // Streaming, token-level remote engine under the frontend's pipeline.
    let body = serde_json::to_vec(&chat_body("token-model", "wait", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    bounded("first event", response.next_event()).await.unwrap();
    drop(response);
    bounded("the token engine to see the stop", stops.recv()).await.unwrap();

    chat_rt.shutdown().await;
    token_rt.shutdown().await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_entries_are_skipped_and_the_watcher_keeps_going() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let discovery = f.runtime.discovery().clone();
    discovery.put(&format!("{MODELS_PREFIX}ns/x/generate/1"), Bytes::from_static(b"{not json")).await.unwrap();
    let ghost = serde_json::json!({
        "name": "ghost", "kind": "backend",
        "endpoint": {"namespace": "ns", "component": "ghost", "name": "generate"}, "instance_id": 99
    });
    discovery.put(&format!("{MODELS_PREFIX}ns/ghost/generate/63"), serde_json::to_vec(&ghost).unwrap().into()).await.unwrap();
    let (refused_rt, _stops) = token_worker(&store, "refused", serde_json::json!({"refuse": true})).await;

    let (worker, _events) = chat_worker(&store, "chat", "good").await;
    wait_for_models(f.addr, &["good"]).await;
    let resp = post(f.addr, "/v1/chat/completions", &chat_body("good", "still works", false)).await;
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "still works ");
    assert_eq!(post(f.addr, "/v1/chat/completions", &chat_body("ghost", "x", false)).await.status, 404);
    assert_eq!(post(f.addr, "/v1/chat/completions", &chat_body("refused", "x", false)).await.status, 404);

    worker.shutdown().await;
    refused_rt.shutdown().await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_worker_keeps_the_model_when_the_first_leaves() {
    let store = Arc::new(MemStore::default());
    let f = frontend(&store).await;
    let (first, _e1) = chat_worker(&store, "chat", "m").await;
    let (second, _e2) = chat_worker(&store, "chat", "m").await;
    wait_for_models(f.addr, &["m"]).await;
    first.shutdown().await;
    // Still listed and served by the remaining instance.
    for _ in 0..3 {
        let resp = post(f.addr, "/v1/chat/completions", &chat_body("m", "a", false)).await;
        assert_eq!(resp.status, 200, "{}", resp.body);
    }
    wait_for_models(f.addr, &["m"]).await;

    // Another component serving the same model takes over when the last one leaves.
    let (other, _e3) = chat_worker(&store, "chat2", "m").await;
    second.shutdown().await;
    poll::eventually("the model is served by chat2", WAIT, async || {
        if post(f.addr, "/v1/chat/completions", &chat_body("m", "a", false)).await.status != 200 {
            return None;
        }
        let models = get(f.addr, "/v1/models").await.json();
        (models["data"].as_array().map(Vec::len) == Some(1)).then_some(())
    })
    .await;
    other.shutdown().await;
    wait_for_models(f.addr, &[]).await;
    f.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopping_the_context_reaches_the_worker_while_the_caller_reads_on() {
    let store = Arc::new(MemStore::default());
    let (worker, mut stops) = token_worker(&store, "t", serde_json::json!({})).await;
    let caller = runtime(&store).await;
    let client = caller.namespace("ns").unwrap().component("backend").unwrap().endpoint("generate").unwrap().client().await.unwrap();
    client.wait_for_instances(Some(WAIT)).await.unwrap();
    let engine = dynamo_llm::remote::RemoteTokenEngine::new(client, RouterMode::Random);

    let echoed = engine.generate(PreprocessedRequest { token_ids: vec![7, 8], ..Default::default() }, RequestContext::new("echo")).await.unwrap();
    let items: Vec<_> = bounded("the echo", echoed.collect::<Vec<_>>()).await;
    let tokens: Vec<u32> = items.iter().flat_map(|i| i.as_ref().unwrap().token_ids.clone()).collect();
    assert_eq!(tokens, vec![7, 8]);
    assert!(items.last().unwrap().as_ref().unwrap().finish_reason.is_some());

    let ctx = RequestContext::new("stop-me");
    let mut stream = engine.generate(PreprocessedRequest { token_ids: vec![0], ..Default::default() }, ctx.clone()).await.unwrap();
    bounded("first item", stream.next()).await.unwrap().unwrap();
    ctx.stop_generating();
    // The worker sees the stop (with the request id propagated), and its stream ends.
    assert_eq!(bounded("the stop", stops.recv()).await.as_deref(), Some("stop-me"));
    assert!(bounded("the end of the stream", stream.next()).await.is_none());
    caller.shutdown().await;
    worker.shutdown().await;
}

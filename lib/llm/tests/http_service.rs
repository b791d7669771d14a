//! The HTTP service over real sockets, with a static (in-process) test engine.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use dynamo_llm::http::HttpService;
use dynamo_llm::model_manager::ModelManager;
use tokio_util::sync::CancellationToken;

struct Fixture {
    service: dynamo_llm::http::RunningHttpService,
    addr: std::net::SocketAddr,
    manager: Arc<ModelManager>,
    events: tokio::sync::mpsc::UnboundedReceiver<EngineEvent>,
}

async fn start(body_limit: Option<usize>, add_model: bool) -> Fixture {
    let manager = Arc::new(ModelManager::new());
    let mut builder = HttpService::builder().host("127.0.0.1").port(0).manager(manager.clone()).drain_timeout(Duration::from_millis(500));
    if let Some(limit) = body_limit {
        builder = builder.body_limit(limit);
    }
    let service = builder.build().unwrap().spawn(CancellationToken::new()).await.unwrap();
    let (engine, events) = ScriptEngine::new();
    if add_model {
        manager.add_full_model("script", engine);
    }
    let addr = service.local_addr();
    Fixture { service, addr, manager, events }
}

fn content_of(events: &[String]) -> String {
    events
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| serde_json::from_str::<serde_json::Value>(e).unwrap())
        .filter_map(|v| v["choices"].get(0).and_then(|c| c["delta"]["content"].as_str().or(c["text"].as_str())).map(String::from))
        .collect()
}

#[tokio::test]
async fn health_and_models_follow_the_manager() {
    let f = start(None, false).await;
    let health = get(f.addr, "/health").await;
    assert_eq!(health.status, 503);
    assert_eq!(health.json()["status"], "unhealthy");
    assert_eq!(get(f.addr, "/live").await.status, 200);
    assert_eq!(get(f.addr, "/v1/models").await.json()["data"], serde_json::json!([]));

    let (engine, _events) = ScriptEngine::new();
    f.manager.add_full_model("script", engine);
    let health = get(f.addr, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json(), serde_json::json!({"status": "healthy", "models": ["script"]}));
    let models = get(f.addr, "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "script");
    assert_eq!(models["data"][0]["object"], "model");
    f.service.shutdown().await.unwrap();
}

#[tokio::test]
async fn streaming_chat_is_sse_ending_with_done() {
    let f = start(None, true).await;
    let body = serde_json::to_vec(&chat_body("script", "hello big world", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    assert_eq!(response.status, 200);
    assert!(response.content_type.starts_with("text/event-stream"), "{}", response.content_type);
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.len(), 5, "{events:?}");
    let first: serde_json::Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(content_of(&events), "hello big world ");
    let last: serde_json::Value = serde_json::from_str(&events[3]).unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
}

#[tokio::test]
async fn include_usage_sends_a_usage_chunk_before_done() {
    let f = start(None, true).await;
    let mut body = chat_body("script", "a b", true);
    body["stream_options"] = serde_json::json!({"include_usage": true});
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(serde_json::to_vec(&body).unwrap()))).await;
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"], serde_json::json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}));

    let body = serde_json::json!({"model": "script", "prompt": "x y z", "stream": true, "stream_options": {"include_usage": true}});
    let mut response = bounded("response", open(f.addr, "POST", "/v1/completions", Some(serde_json::to_vec(&body).unwrap()))).await;
    let events = bounded("events", response.all_events()).await;
    assert_eq!(content_of(&events), "x y z ");
    let usage: serde_json::Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["object"], "text_completion");
    assert_eq!(usage["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn unary_responses_are_folded_with_usage() {
    let f = start(None, true).await;
    let resp = post(f.addr, "/v1/chat/completions", &chat_body("script", "one two", false)).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["object"], "chat.completion");
    assert_eq!(json["choices"][0]["message"]["role"], "assistant");
    assert_eq!(json["choices"][0]["message"]["content"], "one two ");
    assert_eq!(json["choices"][0]["finish_reason"], "stop");
    assert_eq!(json["usage"], serde_json::json!({"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}));

    let resp = post(f.addr, "/v1/completions", &serde_json::json!({"model": "script", "prompt": "p q r"})).await;
    assert_eq!(resp.status, 200, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["object"], "text_completion");
    assert_eq!(json["choices"][0]["text"], "p q r ");
    assert_eq!(json["usage"]["total_tokens"], 6);
}

fn assert_openai_error(resp: &HttpResponse, status: u16, kind: &str, needle: &str) {
    assert_eq!(resp.status, status, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["error"]["type"], kind, "{}", resp.body);
    let message = json["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(needle), "'{message}' does not mention '{needle}'");
}

#[tokio::test]
async fn bad_requests_get_openai_errors() {
    let f = start(Some(1024), true).await;
    let malformed = request(f.addr, "POST", "/v1/chat/completions", Some(b"{\"model\": \"script\", ".to_vec())).await;
    assert_openai_error(&malformed, 400, "invalid_request_error", "JSON");

    let wrong_type = serde_json::json!({"model": "script", "messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"});
    let resp = post(f.addr, "/v1/chat/completions", &wrong_type).await;
    assert_openai_error(&resp, 400, "invalid_request_error", "max_tokens");
    assert_eq!(resp.json()["error"]["param"], "max_tokens");

    let out_of_range = serde_json::json!({"model": "script", "prompt": "x", "temperature": 7.0});
    assert_openai_error(&post(f.addr, "/v1/completions", &out_of_range).await, 400, "invalid_request_error", "temperature");

    let unknown = post(f.addr, "/v1/chat/completions", &chat_body("nope", "hi", false)).await;
    assert_openai_error(&unknown, 404, "not_found_error", "nope");
    assert_eq!(unknown.json()["error"]["code"], "model_not_found");

    let too_large = serde_json::json!({"model": "script", "prompt": "x".repeat(4096)});
    assert_openai_error(&post(f.addr, "/v1/completions", &too_large).await, 413, "invalid_request_error", "limit of 1024 bytes");

    assert_openai_error(&post(f.addr, "/v1/chat/completions", &chat_body("script", "unavailable", true)).await, 503, "service_unavailable", "no capacity");
    assert_openai_error(&post(f.addr, "/v1/chat/completions", &chat_body("script", "bad", false)).await, 400, "invalid_request_error", "refuses");
    assert_openai_error(&post(f.addr, "/v1/chat/completions", &chat_body("script", "fail", false)).await, 500, "internal_error", "exploded");
}

#[tokio::test]
async fn an_error_mid_stream_is_an_error_event_without_done() {
    let f = start(None, true).await;
    let body = serde_json::to_vec(&chat_body("script", "fail", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    assert_eq!(response.status, 200);
    let events = bounded("events", response.all_events()).await;
    assert_eq!(events.len(), 2, "{events:?}");
    let error: serde_json::Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(error["error"]["message"], "engine exploded");
    assert_eq!(error["error"]["type"], "internal_error");
}

async fn expect_stopped(events: &mut tokio::sync::mpsc::UnboundedReceiver<EngineEvent>) {
    loop {
        match bounded("the engine to see the stop", events.recv()).await {
            Some(EngineEvent::Stopped(_)) => return,
            Some(EngineEvent::Started(_)) => continue,
            None => panic!("engine gone"),
        }
    }
}

#[tokio::test]
async fn a_client_leaving_a_stream_stops_the_engine() {
    let mut f = start(None, true).await;
    let body = serde_json::to_vec(&chat_body("script", "wait", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    let first = bounded("first event", response.next_event()).await.unwrap();
    assert!(first.contains("waiting"), "{first}");
    drop(response);
    expect_stopped(&mut f.events).await;
}

#[tokio::test]
async fn a_client_leaving_a_unary_request_stops_the_engine() {
    let mut f = start(None, true).await;
    let addr = f.addr;
    let client = tokio::spawn(async move { post(addr, "/v1/chat/completions", &chat_body("script", "wait", false)).await });
    assert_eq!(bounded("request", f.events.recv()).await, Some(EngineEvent::Started("wait".into())));
    client.abort();
    let _ = client.await;
    expect_stopped(&mut f.events).await;
}

#[tokio::test]
async fn metrics_count_requests_by_outcome() {
    let f = start(None, true).await;
    assert_eq!(post(f.addr, "/v1/chat/completions", &chat_body("script", "a b c", false)).await.status, 200);
    let mut stream = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(serde_json::to_vec(&chat_body("script", "a", true)).unwrap()))).await;
    bounded("events", stream.all_events()).await;
    let mut failed = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(serde_json::to_vec(&chat_body("script", "fail", true)).unwrap()))).await;
    bounded("events", failed.all_events()).await;

    let metrics = get(f.addr, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.body;
    for line in [
        r#"dynamo_frontend_requests_total{endpoint="chat_completions",model="script",request_type="unary",status="success"} 1"#,
        r#"dynamo_frontend_requests_total{endpoint="chat_completions",model="script",request_type="stream",status="success"} 1"#,
        r#"dynamo_frontend_requests_total{endpoint="chat_completions",model="script",request_type="stream",status="error"} 1"#,
        r#"dynamo_frontend_inflight_requests{model="script"} 0"#,
        r#"dynamo_frontend_input_sequence_tokens_sum{model="script"} 5"#,
        r#"dynamo_frontend_output_sequence_tokens_sum{model="script"} 5"#,
        r#"dynamo_frontend_time_to_first_token_seconds_count{model="script"} 3"#,
        r#"dynamo_frontend_request_duration_seconds_count{model="script"} 3"#,
    ] {
        assert!(text.contains(line), "missing {line} in\n{text}");
    }
    assert!(text.contains("dynamo_frontend_inter_token_latency_seconds_count"), "{text}");
}

#[tokio::test]
async fn shutdown_ends_streams_that_outlive_the_drain_bound() {
    let mut f = start(None, true).await;
    let body = serde_json::to_vec(&chat_body("script", "wait", true)).unwrap();
    let mut response = bounded("response", open(f.addr, "POST", "/v1/chat/completions", Some(body))).await;
    bounded("first event", response.next_event()).await.unwrap();
    bounded("shutdown", f.service.shutdown()).await.unwrap();
    let rest = bounded("the rest of the stream", response.all_events()).await;
    assert!(rest.iter().any(|e| e.contains("shutting down")), "{rest:?}");
    expect_stopped(&mut f.events).await;
}

//! The HTTP service as a public endpoint: connection limits and timeouts, the
//! in-flight cap, the API key, CORS, request ids, status metrics, and the OpenAI
//! semantics (default `max_tokens`, refused fields, `n`, `stop`, `logprobs`), over
//! raw sockets against echo engines.

use crate::common;
use crate::poll;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use dynamo_llm::engines::echo::{EchoCore, EchoFull};
use dynamo_llm::http::{AdmissionLimits, HttpLimits, HttpService, HttpServiceBuilder, RunningHttpService};
use dynamo_llm::model_card::ModelDeploymentCard;
use dynamo_llm::model_manager::ModelManager;
use dynamo_llm::pipeline::Pipeline;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// A raw HTTP/1.1 response.
#[derive(Debug)]
struct Raw {
    status: u16,
    headers: HashMap<String, String>,
    body: String,
}

impl Raw {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

fn parse(text: &str) -> Raw {
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text, ""));
    let mut lines = head.lines();
    let status = lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).unwrap_or(0);
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let headers: HashMap<String, String> = headers;
    let body = if headers.get("transfer-encoding").is_some_and(|v| v == "chunked") { dechunk(body) } else { body.to_string() };
    Raw { status, headers, body }
}

/// The payload of a chunked body.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else { break };
        if size == 0 || after.len() < size {
            break;
        }
        out.push_str(&after[..size]);
        rest = after[size..].trim_start_matches("\r\n");
    }
    out
}

/// Send `head` (without the blank line) and `body` on a fresh connection with
/// `Connection: close`, and read the whole answer.
async fn raw(addr: SocketAddr, head: &str, body: &str) -> Raw {
    let mut stream = bounded("connect", TcpStream::connect(addr)).await.unwrap();
    let message = format!("{head}\r\nHost: test\r\nConnection: close\r\nContent-Length: {}\r\n\r\n{body}", body.len());
    stream.write_all(message.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    bounded("response", stream.read_to_end(&mut out)).await.unwrap();
    parse(&String::from_utf8_lossy(&out))
}

async fn post_json(addr: SocketAddr, path: &str, body: &Value, extra: &str) -> Raw {
    let head = format!("POST {path} HTTP/1.1\r\nContent-Type: application/json{extra}");
    raw(addr, &head, &body.to_string()).await
}

/// Whether the server closes `stream` (EOF or reset) within the test bound.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    loop {
        match tokio::time::timeout(WAIT, stream.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // a 408 or similar before the close
        }
    }
}

fn limits() -> HttpLimits {
    HttpLimits { header_timeout: Duration::from_millis(300), body_timeout: Duration::from_millis(300), ..Default::default() }
}

/// A service serving `echo` (echo_full, `delay` per character) and `bytes` (echo_core
/// through the pipeline, the built-in card with a 2048-token context).
async fn start(builder: HttpServiceBuilder, delay: Duration) -> RunningHttpService {
    let manager = Arc::new(ModelManager::new());
    manager.add_full_model("echo", Arc::new(EchoFull::new(delay)));
    let card = ModelDeploymentCard::builtin("bytes").with_context_length(2048).unwrap();
    let pipeline = Pipeline::new(Arc::new(card), Arc::new(EchoCore::new(Duration::ZERO))).unwrap();
    manager.add_full_model("bytes", Arc::new(pipeline));
    let builder = builder.host("127.0.0.1").port(0).manager(manager).drain_timeout(Duration::from_millis(500));
    builder.build().unwrap().spawn(CancellationToken::new()).await.unwrap()
}

fn chat(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

#[tokio::test]
async fn unfinished_headers_and_idle_connections_are_closed() {
    let service = start(HttpService::builder().limits(limits()), Duration::ZERO).await;
    let addr = service.local_addr();

    let mut slowloris = TcpStream::connect(addr).await.unwrap();
    slowloris.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert!(closed_by_server(&mut slowloris).await, "a connection that never finished its headers stayed open");
    assert!(closed_by_server(&mut idle).await, "an idle connection stayed open");

    // After one request on a keep-alive connection, idling closes it too.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /live HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 4096];
    let n = bounded("live", kept.read(&mut buf)).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(closed_by_server(&mut kept).await, "an idle keep-alive connection stayed open");

    assert_eq!(raw(addr, "GET /live HTTP/1.1", "").await.status, 200, "the server serves afterwards");
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_response_longer_than_the_header_timeout_is_not_cut() {
    let service = start(HttpService::builder().limits(limits()), Duration::from_millis(50)).await;
    let body = json!({"model": "echo", "messages": [{"role": "user", "content": "twenty characters!!!"}], "stream": true});
    let started = std::time::Instant::now();
    let streamed = post_json(service.local_addr(), "/v1/chat/completions", &body, "").await;
    assert!(started.elapsed() > limits().header_timeout * 2, "the test needs a response slower than the timeout");
    assert!(streamed.body.contains("[DONE]"), "{streamed:?}");
    let unary = post_json(service.local_addr(), "/v1/chat/completions", &chat("echo", "twenty characters!!!"), "").await;
    assert_eq!(unary.json()["choices"][0]["message"]["content"], "twenty characters!!!");
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_body_that_does_not_arrive_is_a_408() {
    let service = start(HttpService::builder().limits(limits()), Duration::ZERO).await;
    let mut stream = TcpStream::connect(service.local_addr()).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"model\"";
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    bounded("408", stream.read_to_end(&mut out)).await.unwrap();
    let response = parse(&String::from_utf8_lossy(&out));
    assert_eq!(response.status, 408, "{response:?}");
    assert!(response.json()["error"]["message"].as_str().unwrap().contains("did not arrive"));
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn requests_past_the_inflight_cap_get_503_with_retry_after() {
    let limits = HttpLimits { max_inflight: 1, ..limits() };
    let service = start(HttpService::builder().limits(limits), Duration::from_millis(200)).await;
    let addr = service.local_addr();
    let body = serde_json::to_vec(&json!({"model": "echo", "messages": [{"role": "user", "content": "a long answer"}], "stream": true})).unwrap();
    let mut first = bounded("first stream", open(addr, "POST", "/v1/chat/completions", Some(body))).await;
    assert_eq!(first.status, 200);
    bounded("first event", first.next_event()).await.unwrap();

    let refused = post_json(addr, "/v1/chat/completions", &chat("echo", "x"), "").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert_eq!(refused.headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(refused.json()["error"]["type"], "service_unavailable");
    // Not counted: the probes and the metrics.
    assert_eq!(raw(addr, "GET /health HTTP/1.1", "").await.status, 200);
    assert_eq!(raw(addr, "GET /ready HTTP/1.1", "").await.status, 200);
    assert_eq!(raw(addr, "GET /metrics HTTP/1.1", "").await.status, 200);

    drop(first); // the client leaves: its slot frees
    poll::eventually("the slot is released (a request gets 200)", WAIT, async || {
        let body = json!({"model": "echo", "prompt": "ok", "max_tokens": 1});
        (post_json(addr, "/v1/completions", &body, "").await.status == 200).then_some(())
    })
    .await;
    service.shutdown().await.unwrap();
}

/// The value of the metric line starting with `series` in `/metrics` (0 without one).
async fn metric(addr: SocketAddr, series: &str) -> f64 {
    let text = raw(addr, "GET /metrics HTTP/1.1", "").await.body;
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0)
}

#[tokio::test]
async fn a_model_past_its_inflight_limit_gets_429_and_other_models_are_served() {
    let limits = HttpLimits {
        admission: AdmissionLimits { max_inflight_requests: Some(1), ..Default::default() },
        ..limits()
    };
    let service = start(HttpService::builder().limits(limits), Duration::from_millis(200)).await;
    let addr = service.local_addr();
    let body = serde_json::to_vec(&json!({"model": "echo", "messages": [{"role": "user", "content": "a long answer"}], "stream": true})).unwrap();
    let mut first = bounded("first stream", open(addr, "POST", "/v1/chat/completions", Some(body))).await;
    assert_eq!(first.status, 200);
    bounded("first event", first.next_event()).await.unwrap();

    let refused = post_json(addr, "/v1/chat/completions", &chat("echo", "x"), "").await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(refused.json()["error"]["type"], "rate_limit_error");
    assert_eq!(refused.json()["error"]["code"], "rate_limit_exceeded");
    // Another model has its own limit.
    let other = post_json(addr, "/v1/completions", &json!({"model": "bytes", "prompt": "ok", "max_tokens": 2}), "").await;
    assert_eq!(other.status, 200, "{other:?}");
    let rejected = r#"dynamo_frontend_admission_rejected_total{model="echo",reason="inflight_requests"}"#;
    assert_eq!(metric(addr, rejected).await, 1.0);

    drop(first); // the client leaves: its share frees
    poll::eventually("the share is released (a request gets 200)", WAIT, async || {
        (post_json(addr, "/v1/chat/completions", &chat("echo", "y"), "").await.status == 200).then_some(())
    })
    .await;
    assert_eq!(metric(addr, r#"dynamo_frontend_admission_inflight_requests{model="echo"}"#).await, 0.0);
    assert!(metric(addr, r#"dynamo_frontend_admission_admitted_total{model="echo"}"#).await >= 2.0);
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_response_holds_its_models_share_until_its_generation_ends() {
    let limits = HttpLimits {
        admission: AdmissionLimits { max_inflight_requests: Some(1), ..Default::default() },
        ..limits()
    };
    let service = start(HttpService::builder().limits(limits), Duration::from_millis(100)).await;
    let addr = service.local_addr();
    let inflight = r#"dynamo_frontend_admission_inflight_requests{model="echo"}"#;
    let response = |extra: Value| {
        let mut body = json!({"model": "echo", "input": "a long answer to hold the share"});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        serde_json::to_vec(&body).unwrap()
    };

    // A streamed response takes the model's one share, like a chat request.
    let mut streamed = bounded("a streamed response", open(addr, "POST", "/v1/responses", Some(response(json!({"stream": true}))))).await;
    assert_eq!(streamed.status, 200);
    bounded("its first event", streamed.next_event()).await.unwrap();
    let refused = post_json(addr, "/v1/responses", &json!({"model": "echo", "input": "x"}), "").await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert_eq!(refused.headers.get("retry-after").map(String::as_str), Some("1"));
    assert_eq!(post_json(addr, "/v1/chat/completions", &chat("echo", "y"), "").await.status, 429);
    drop(streamed);
    poll::eventually("the streamed response lets go", WAIT, async || (metric(addr, inflight).await == 0.0).then_some(())).await;

    // A background response holds it until its generation ends, with no client at all.
    let background = post_json(addr, "/v1/responses", &serde_json::from_slice(&response(json!({"background": true}))).unwrap(), "").await;
    assert_eq!(background.status, 200, "{background:?}");
    assert_eq!(metric(addr, inflight).await, 1.0);
    assert_eq!(post_json(addr, "/v1/chat/completions", &chat("echo", "z"), "").await.status, 429);
    poll::eventually("the background generation ends and lets go", WAIT, async || {
        (post_json(addr, "/v1/chat/completions", &chat("echo", "w"), "").await.status == 200).then_some(())
    })
    .await;
    let rejected = r#"dynamo_frontend_admission_rejected_total{model="echo",reason="inflight_requests"}"#;
    assert!(metric(addr, rejected).await >= 3.0);
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn queued_prompt_tokens_are_limited_and_a_cancelled_request_releases_them() {
    let manager = Arc::new(ModelManager::new());
    let card = ModelDeploymentCard::builtin("bytes").with_context_length(2048).unwrap();
    // A first token 30 s away: the prompt stays queued until the client leaves.
    let pipeline = Pipeline::new(Arc::new(card), Arc::new(EchoCore::new(Duration::from_secs(30)))).unwrap();
    manager.add_full_model("slow", Arc::new(pipeline));
    let limits = HttpLimits {
        admission: AdmissionLimits { max_queued_tokens: Some(40), ..Default::default() },
        ..limits()
    };
    let builder = HttpService::builder().limits(limits).host("127.0.0.1").port(0).manager(manager);
    let service = builder.build().unwrap().spawn(CancellationToken::new()).await.unwrap();
    let addr = service.local_addr();
    let queued = r#"dynamo_frontend_admission_queued_tokens{model="slow"}"#;

    let prompt = json!({"model": "slow", "prompt": "thirty bytes of prompt, queued", "max_tokens": 1});
    let waiting = tokio::spawn(async move { post_json(addr, "/v1/completions", &prompt, "").await });
    poll::eventually("the first prompt is queued", WAIT, async || (metric(addr, queued).await == 30.0).then_some(())).await;
    let refused = post_json(addr, "/v1/completions", &json!({"model": "slow", "prompt": "twenty more bytes...", "max_tokens": 1}), "").await;
    assert_eq!(refused.status, 429, "{refused:?}");
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("prompt tokens queued"));
    assert_eq!(refused.headers.get("retry-after").map(String::as_str), Some("1"));
    // Nothing leaks: the refused request holds nothing, the cancelled one lets go.
    assert_eq!(metric(addr, queued).await, 30.0);
    waiting.abort();
    poll::eventually("the cancelled prompt is released", WAIT, async || (metric(addr, queued).await == 0.0).then_some(())).await;
    assert_eq!(metric(addr, r#"dynamo_frontend_admission_inflight_requests{model="slow"}"#).await, 0.0);
    drop(service);
}

#[tokio::test]
async fn connections_past_the_cap_get_503_and_are_closed() {
    let limits = HttpLimits { max_connections: 1, header_timeout: Duration::from_secs(5), ..limits() };
    let service = start(HttpService::builder().limits(limits), Duration::ZERO).await;
    let addr = service.local_addr();
    let holder = TcpStream::connect(addr).await.unwrap();
    // The server accepts in order: once it has taken the holder, the next connection
    // is past the cap.
    let refused = poll::eventually("a connection past the cap is refused", WAIT, async || {
        let answer = raw(addr, "GET /live HTTP/1.1", "").await;
        (answer.status == 503).then_some(answer)
    })
    .await;
    assert!(refused.headers.contains_key("retry-after"));
    drop(holder);
    poll::eventually("the connection slot is released", WAIT, async || {
        (raw(addr, "GET /live HTTP/1.1", "").await.status == 200).then_some(())
    })
    .await;
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn request_ids_api_key_cors_and_status_metrics() {
    let builder = HttpService::builder().limits(limits()).api_key("sekret").cors_origins(vec!["https://app.example".into()]);
    let service = start(builder, Duration::ZERO).await;
    let addr = service.local_addr();

    let missing = post_json(addr, "/v1/chat/completions", &chat("echo", "hi"), "").await;
    assert_eq!(missing.status, 401);
    assert_eq!(missing.json()["error"]["code"], "invalid_api_key");
    let wrong = post_json(addr, "/v1/chat/completions", &chat("echo", "hi"), "\r\nAuthorization: Bearer nope").await;
    assert_eq!(wrong.status, 401);
    let auth = "\r\nAuthorization: Bearer sekret";
    let ok = post_json(addr, "/v1/chat/completions", &chat("echo", "hi"), &format!("{auth}\r\nx-request-id: client-id-1")).await;
    assert_eq!(ok.status, 200, "{ok:?}");
    assert_eq!(ok.headers.get("x-request-id").map(String::as_str), Some("client-id-1"));
    let generated = raw(addr, "GET /live HTTP/1.1", "").await;
    assert_eq!(generated.status, 200, "/live needs no key");
    assert_eq!(raw(addr, "GET /ready HTTP/1.1", "").await.status, 200, "/ready needs no key");
    assert_eq!(generated.headers.get("x-request-id").map(String::len), Some(36), "{generated:?}");
    assert_eq!(raw(addr, &format!("GET /v1/models HTTP/1.1{auth}"), "").await.status, 200);
    assert_eq!(raw(addr, "GET /v1/models HTTP/1.1", "").await.status, 401);

    let preflight = raw(
        addr,
        "OPTIONS /v1/chat/completions HTTP/1.1\r\nOrigin: https://app.example\r\nAccess-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: authorization",
        "",
    )
    .await;
    assert_eq!(preflight.headers.get("access-control-allow-origin").map(String::as_str), Some("https://app.example"));
    let other = raw(addr, "GET /live HTTP/1.1\r\nOrigin: https://evil.example", "").await;
    assert!(!other.headers.contains_key("access-control-allow-origin"));

    assert_eq!(post_json(addr, "/v1/chat/completions", &json!({"model": 5}), auth).await.status, 400);
    assert_eq!(post_json(addr, "/v1/chat/completions", &chat("nope", "hi"), auth).await.status, 404);
    let metrics = raw(addr, "GET /metrics HTTP/1.1", "").await.body;
    for needle in [
        r#"dynamo_frontend_responses_total{endpoint="/v1/chat/completions",status="401"} 2"#,
        r#"dynamo_frontend_responses_total{endpoint="/v1/chat/completions",status="400"} 1"#,
        r#"dynamo_frontend_responses_total{endpoint="/v1/chat/completions",status="404"} 1"#,
        r#"dynamo_frontend_responses_total{endpoint="/v1/chat/completions",status="200"} 1"#,
    ] {
        assert!(metrics.contains(needle), "{needle} not in\n{metrics}");
    }
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn openai_semantics() {
    let limits = HttpLimits { default_max_tokens: 5, ..limits() };
    let service = start(HttpService::builder().limits(limits), Duration::ZERO).await;
    let addr = service.local_addr();

    // Default max_tokens, and the context as ceiling.
    let r = post_json(addr, "/v1/chat/completions", &chat("echo", "abcdefghijklmnop"), "").await.json();
    assert_eq!(r["choices"][0]["message"]["content"], "abcde");
    assert_eq!(r["choices"][0]["finish_reason"], "length");

    // Refused fields name themselves; wrong types name the field.
    for (field, value) in [
        ("functions", json!([{"name": "f"}])),
        ("tools", json!([{"type": "function", "function": {"description": "no name"}}])),
        ("logit_bias", json!({"50256": -100})),
        ("top_logprobs", json!(2)),
    ] {
        let mut body = chat("echo", "hi");
        body[field] = value;
        let e = post_json(addr, "/v1/chat/completions", &body, "").await;
        assert_eq!(e.status, 400, "{field}: {e:?}");
        assert!(e.json()["error"]["message"].as_str().unwrap().contains(field), "{field}: {e:?}");
    }
    for (field, value) in [("best_of", json!(3)), ("suffix", json!("end")), ("logprobs", json!("yes"))] {
        let mut body = json!({"model": "echo", "prompt": "hi"});
        body[field] = value;
        let e = post_json(addr, "/v1/completions", &body, "").await;
        assert_eq!(e.status, 400, "{field}: {e:?}");
        assert!(e.json()["error"]["message"].as_str().unwrap().contains(field), "{field}: {e:?}");
    }
    let mut body = chat("echo", "hi");
    body["response_format"] = json!({"type": "json_schema", "json_schema": {"name": "x", "schema": "not an object"}});
    assert_eq!(post_json(addr, "/v1/chat/completions", &body, "").await.status, 400);
    body["response_format"] = json!({"type": "json_object"});
    assert_eq!(post_json(addr, "/v1/chat/completions", &body, "").await.status, 200);

    // n: one choice per run, indexed, whole and streamed.
    let mut body = chat("echo", "hey");
    body["n"] = json!(2);
    let r = post_json(addr, "/v1/chat/completions", &body, "").await.json();
    let choices = r["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{r}");
    assert_eq!((choices[0]["index"].clone(), choices[1]["index"].clone()), (json!(0), json!(1)));
    assert!(choices.iter().all(|c| c["message"]["content"] == "hey"));
    assert_eq!(r["usage"]["completion_tokens"], 6);
    assert_eq!(r["usage"]["prompt_tokens"], 3);
    body["stream"] = json!(true);
    let streamed = post_json(addr, "/v1/chat/completions", &body, "").await;
    let indices: std::collections::BTreeSet<u64> = streamed
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["choices"][0]["index"].as_u64())
        .collect();
    assert_eq!(indices.into_iter().collect::<Vec<_>>(), vec![0, 1]);

    // stop in echo_full, whole and streamed, never emitted.
    let mut body = json!({"model": "echo", "prompt": "hello world", "stop": ["wor"], "max_tokens": 50});
    let r = post_json(addr, "/v1/completions", &body, "").await.json();
    assert_eq!(r["choices"][0]["text"], "hello ");
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    body["stream"] = json!(true);
    let streamed = post_json(addr, "/v1/completions", &body, "").await.body;
    assert!(!streamed.contains("\"w\"") && streamed.contains("\"stop\""), "{streamed}");

    // logprobs: one entry per token.
    let mut body = chat("echo", "abc");
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(1);
    let r = post_json(addr, "/v1/chat/completions", &body, "").await.json();
    let content = r["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.iter().map(|t| t["token"].as_str().unwrap()).collect::<String>(), "abc");
    assert_eq!(content[0]["top_logprobs"][0]["token"], "a");

    // Embeddings: no embedding model.
    let e = post_json(addr, "/v1/embeddings", &json!({"model": "echo", "input": "x"}), "").await;
    assert_eq!(e.status, 404);
    assert_eq!(e.json()["error"]["code"], "model_not_found");
    assert_eq!(post_json(addr, "/v1/embeddings", &json!({"input": "x"}), "").await.status, 400);
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_prompt_far_beyond_the_context_is_refused_before_tokenizing() {
    let service = start(HttpService::builder().limits(limits()), Duration::ZERO).await;
    let addr = service.local_addr();
    let big = "y".repeat(2048 * dynamo_llm::preprocessor::MAX_PROMPT_BYTES_PER_TOKEN + 1);
    let e = post_json(addr, "/v1/chat/completions", &chat("bytes", &big), "").await;
    assert_eq!(e.status, 400, "{e:?}");
    assert!(e.json()["error"]["message"].as_str().unwrap().contains("bytes of prompt"), "{e:?}");
    // Over the inline bound but within the limit: tokenized on the pool, then the context check.
    let mid = "z".repeat(dynamo_llm::preprocessor::blocking::INLINE_BYTES + 1);
    let e = post_json(addr, "/v1/completions", &json!({"model": "bytes", "prompt": mid}), "").await;
    assert_eq!(e.status, 400, "{e:?}");
    assert!(e.json()["error"]["message"].as_str().unwrap().contains("context length"), "{e:?}");
    let ok = post_json(addr, "/v1/completions", &json!({"model": "bytes", "prompt": "hi", "logprobs": 1}), "").await.json();
    assert_eq!(ok["choices"][0]["text"], "hi");
    service.shutdown().await.unwrap();
}

//! `in=http`: a local engine on an ephemeral port; `out=dyn` with workers started as
//! `in=dyn://…` processes sharing a `file` discovery directory.

use crate::common;

use common::*;

#[test]
fn http_echo_full_answers_chat_and_completions_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = command(
        &["in=http", "out=echo_full", "--http-port", "0", "--http-host", "127.0.0.1", "--model-name", "echo"],
        dir.path(),
    );
    let (server, line) = Server::start("frontend", cmd, "serving http on");
    assert!(line.contains("models: echo"), "{line}");
    let addr = http_address(&line);

    let models = http(addr, "GET", "/v1/models", None);
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "echo");

    let resp = chat(addr, "echo", "hi there", serde_json::json!({}));
    assert_eq!(resp.status, 200, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["choices"][0]["message"]["content"], "hi there");
    assert_eq!(json["choices"][0]["finish_reason"], "stop");

    let resp = http(
        addr,
        "POST",
        "/v1/completions",
        Some(&serde_json::json!({"model": "echo", "prompt": "abc", "max_tokens": 2})),
    );
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["choices"][0]["text"], "ab");

    let streamed = chat(addr, "echo", "sse", serde_json::json!({"stream": true}));
    assert_eq!(streamed.status, 200);
    assert!(streamed.body.trim_end().ends_with("data: [DONE]"), "{}", streamed.body);

    assert_eq!(chat(addr, "nope", "x", serde_json::json!({})).status, 404);

    let status = server.terminate();
    assert_eq!(status.code(), Some(0), "graceful shutdown exits 0");
}

#[test]
fn http_serves_a_mocker_behind_the_preprocessor() {
    let dir = tempfile::tempdir().unwrap();
    let cmd = command(&["in=http", "out=mocker", "--http-port", "0", "--http-host", "127.0.0.1"], dir.path());
    let (server, line) = Server::start("frontend", cmd, "serving http on");
    assert!(line.contains("models: dynamo"), "{line}");
    let addr = http_address(&line);
    let resp = chat(addr, "dynamo", "count my tokens", serde_json::json!({"max_tokens": 4}));
    assert_eq!(resp.status, 200, "{}", resp.body);
    let json = resp.json();
    assert_eq!(json["usage"]["completion_tokens"], 4, "{json}");
    assert_eq!(json["choices"][0]["finish_reason"], "length");
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn a_frontend_discovers_workers_on_dyn_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let frontend_cmd = command(&["in=http", "out=dyn", "--http-port", "0", "--http-host", "127.0.0.1"], dir.path());
    let (frontend, line) = Server::start("frontend", frontend_cmd, "serving http on");
    let addr = http_address(&line);
    assert_eq!(http(addr, "GET", "/health", None).status, 503, "no model yet");

    // echo_full registers as a chat model: both routes work through the frontend.
    let full_cmd = command(&["in=dyn://test.full.generate", "out=echo_full", "--model-name", "full"], dir.path());
    let (full, line) = Server::start("echo_full worker", full_cmd, "serving model");
    assert!(line.contains("'full' (chat"), "{line}");
    wait_for_model(addr, "full");
    let resp = chat(addr, "full", "over the wire", serde_json::json!({}));
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["choices"][0]["message"]["content"], "over the wire");
    let resp = http(addr, "POST", "/v1/completions", Some(&serde_json::json!({"model": "full", "prompt": "both"})));
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["choices"][0]["text"], "both");

    // The mocker registers as a backend model with its card; the frontend preprocesses.
    let mocker_cmd = command(&["in=dyn://test.mocker.generate", "out=mocker", "--model-name", "mock"], dir.path());
    let (mocker, line) = Server::start("mocker worker", mocker_cmd, "serving model");
    assert!(line.contains("'mock' (backend"), "{line}");
    wait_for_model(addr, "mock");
    let resp = chat(addr, "mock", "hello", serde_json::json!({"max_tokens": 3}));
    assert_eq!(resp.status, 200, "{}", resp.body);
    assert_eq!(resp.json()["usage"]["completion_tokens"], 3);
    assert_eq!(http(addr, "GET", "/health", None).status, 200);

    // Workers leave on SIGTERM and their models go.
    assert_eq!(full.terminate().code(), Some(0));
    assert_eq!(mocker.terminate().code(), Some(0));
    let deadline = std::time::Instant::now() + WAIT;
    while http(addr, "GET", "/health", None).status != 503 {
        assert!(std::time::Instant::now() < deadline, "models never went away");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(frontend.terminate().code(), Some(0));
}

#[test]
fn batch_waits_for_a_discovered_model() {
    let dir = tempfile::tempdir().unwrap();
    let worker_cmd = command(&["in=dyn://test.echo.generate", "out=echo_full"], dir.path());
    let (worker, _) = Server::start("worker", worker_cmd, "serving model");
    let input = dir.path().join("prompts.jsonl");
    std::fs::write(&input, "{\"text\": \"remote\"}\n").unwrap();
    let done = run(command(&[&format!("in=batch:{}", input.display()), "out=dyn"], dir.path()), "");
    assert_eq!(done.code(), Some(0), "{done:?}");
    let output = std::fs::read_to_string(dir.path().join("output.jsonl")).unwrap();
    let line: serde_json::Value = serde_json::from_str(output.trim()).unwrap();
    assert_eq!(line["response"], "remote");
    assert_eq!(worker.terminate().code(), Some(0));
}

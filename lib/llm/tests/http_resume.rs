//! Resumable streams over HTTP: opt-in by header, resume after an event id, cancel, the
//! grace period, and a resume sent to another frontend that forwards it to the owner
//! (both frontends sharing one in-memory discovery store as their directory).

use crate::common;
use crate::poll;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::bounded;
use dynamo_llm::engines::echo::EchoFull;
use dynamo_llm::http::streams::{DiscoveryDirectory, StreamsConfig};
use dynamo_llm::http::{AdmissionLimits, HttpLimits, HttpService, HttpServiceBuilder, RunningHttpService};
use dynamo_llm::model_manager::ModelManager;
use dynamo_runtime::discovery::{MemDiscovery, MemStore};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// One SSE event as the client saw it.
#[derive(Debug, Clone, PartialEq)]
struct Event {
    id: Option<u64>,
    data: String,
}

/// A response read incrementally; dropping it closes the connection.
struct Open {
    status: u16,
    headers: hyper::HeaderMap,
    body: Incoming,
    buffer: String,
    connection: tokio::task::JoinHandle<()>,
}

impl Drop for Open {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl Open {
    async fn next(&mut self) -> Option<Event> {
        bounded("an SSE event", async {
            loop {
                if let Some(end) = self.buffer.find("\n\n") {
                    let raw: String = self.buffer.drain(..end + 2).collect();
                    let id = raw.lines().find_map(|l| l.strip_prefix("id: ")).map(|v| v.parse().unwrap());
                    let data: Vec<&str> = raw.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                    if !data.is_empty() {
                        return Some(Event { id, data: data.join("\n") });
                    }
                    continue;
                }
                let frame = self.body.frame().await?.expect("body frame");
                if let Ok(data) = frame.into_data() {
                    self.buffer.push_str(std::str::from_utf8(&data).unwrap());
                }
            }
        })
        .await
    }

    async fn rest(&mut self) -> Vec<Event> {
        let mut out = Vec::new();
        while let Some(e) = self.next().await {
            out.push(e);
        }
        out
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_string())
    }
}

async fn open(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&Value>) -> Open {
    bounded("a response head", async {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.unwrap();
        let connection = tokio::spawn(async move {
            let _ = conn.await;
        });
        let mut request = hyper::Request::builder().method(method).uri(path).header("host", addr.to_string());
        for (k, v) in headers {
            request = request.header(*k, *v);
        }
        let body = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
        let request = request.header("content-type", "application/json").body(Full::new(body)).unwrap();
        let response = sender.send_request(request).await.unwrap();
        let (parts, body) = response.into_parts();
        Open { status: parts.status.as_u16(), headers: parts.headers, body, buffer: String::new(), connection }
    })
    .await
}

fn chat(content: &str) -> Value {
    json!({"model": "echo", "stream": true, "messages": [{"role": "user", "content": content}]})
}

/// The content deltas of chat chunks, joined.
fn text(events: &[Event]) -> String {
    events
        .iter()
        .filter(|e| e.data != "[DONE]")
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok())
        .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
        .collect()
}

async fn start(builder: HttpServiceBuilder) -> RunningHttpService {
    let manager = Arc::new(ModelManager::new());
    manager.add_full_model("echo", Arc::new(EchoFull::new(Duration::from_millis(10))));
    let builder = builder.host("127.0.0.1").port(0).manager(manager).drain_timeout(Duration::from_millis(500));
    builder.build().unwrap().spawn(CancellationToken::new()).await.unwrap()
}

const RESUMABLE: (&str, &str) = ("x-dynamo-resumable", "true");
const PROMPT: &str = "the quick brown fox jumps over the lazy dog";

/// A resumable stream whose client leaves keeps what admission gave it until its
/// generation ends: with `limits` allowing one request, another is refused with
/// `refused` meanwhile, and served once the detached generation is over.
async fn a_detached_stream_holds_until_its_generation_ends(limits: HttpLimits, refused: u16) {
    let service = start(HttpService::builder().limits(limits)).await;
    let addr = service.local_addr();
    // About two seconds of generation at 10 ms per token.
    let long = PROMPT.repeat(5);
    let mut client = open(addr, "POST", "/v1/chat/completions", &[RESUMABLE], Some(&chat(&long))).await;
    assert_eq!(client.status, 200);
    client.next().await.expect("a first event");
    drop(client);
    // The client left; its generation goes on, and so does its share.
    let second = open(addr, "POST", "/v1/chat/completions", &[], Some(&chat("x"))).await;
    assert_eq!(second.status, refused, "a detached generation still holds the one request allowed");
    drop(second);
    poll::eventually("the generation ends and lets go", common::WAIT, async || {
        (open(addr, "POST", "/v1/chat/completions", &[], Some(&chat("y"))).await.status == 200).then_some(())
    })
    .await;
    service.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_detached_stream_holds_its_models_share_until_its_generation_ends() {
    let limits = HttpLimits {
        admission: AdmissionLimits { max_inflight_requests: Some(1), ..Default::default() },
        ..HttpLimits::default()
    };
    a_detached_stream_holds_until_its_generation_ends(limits, 429).await;
}

#[tokio::test]
async fn a_detached_stream_holds_its_global_slot_until_its_generation_ends() {
    let limits = HttpLimits { max_inflight: 1, ..HttpLimits::default() };
    a_detached_stream_holds_until_its_generation_ends(limits, 503).await;
}

#[tokio::test]
async fn a_dropped_client_resumes_after_its_last_event() {
    let service = start(HttpService::builder()).await;
    let addr = service.local_addr();

    let mut whole = open(addr, "POST", "/v1/chat/completions", &[], Some(&chat(PROMPT))).await;
    let uninterrupted = whole.rest().await;
    assert!(uninterrupted.iter().all(|e| e.id.is_none()), "a plain stream has no ids, as before");

    let headers = [RESUMABLE, ("x-request-id", "resume-1")];
    let mut first = open(addr, "POST", "/v1/chat/completions", &headers, Some(&chat(PROMPT))).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-request-id").as_deref(), Some("resume-1"));
    assert_eq!(first.header("x-dynamo-resumable").as_deref(), Some("true"));
    let mut before = Vec::new();
    for _ in 0..3 {
        before.push(first.next().await.unwrap());
    }
    drop(first);
    let last = before.last().unwrap().id.unwrap().to_string();

    let mut resumed = open(addr, "GET", "/v1/streams/resume-1", &[("last-event-id", &last)], None).await;
    assert_eq!(resumed.status, 200);
    let after = resumed.rest().await;
    let joined: Vec<Event> = before.into_iter().chain(after).collect();
    let ids: Vec<u64> = joined.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(ids, (0..joined.len() as u64).collect::<Vec<_>>(), "no event duplicated or missing");
    assert_eq!(text(&joined), text(&uninterrupted));
    assert_eq!(text(&joined), PROMPT);
    assert_eq!(joined.last().unwrap().data, "[DONE]");

    // Finished, still retained: a replay with ?after= gives the tail again.
    let mut replay = open(addr, "GET", "/v1/streams/resume-1?after=2", &[], None).await;
    assert_eq!(replay.rest().await, joined[3..].to_vec());
}

#[tokio::test]
async fn cancel_aborts_and_unknown_or_bad_cursors_are_refused() {
    let service = start(HttpService::builder()).await;
    let addr = service.local_addr();
    let headers = [RESUMABLE, ("x-request-id", "to-cancel")];
    let mut stream = open(addr, "POST", "/v1/chat/completions", &headers, Some(&chat(&"x".repeat(500)))).await;
    stream.next().await.unwrap();

    let mut bad = open(addr, "GET", "/v1/streams/to-cancel", &[("last-event-id", "nope")], None).await;
    assert_eq!(bad.status, 400);
    drop(bad.rest().await);
    let beyond = open(addr, "GET", "/v1/streams/to-cancel?after=100000", &[], None).await;
    assert_eq!(beyond.status, 400);

    let cancelled = open(addr, "DELETE", "/v1/streams/to-cancel", &[], None).await;
    assert_eq!(cancelled.status, 200);
    let rest = stream.rest().await;
    assert!(rest.len() < 500, "the stream ended early");
    assert_ne!(rest.last().map(|e| e.data.as_str()), Some("[DONE]"));

    assert_eq!(open(addr, "GET", "/v1/streams/to-cancel", &[], None).await.status, 404);
    assert_eq!(open(addr, "POST", "/v1/streams/to-cancel/cancel", &[], None).await.status, 404);
}

#[tokio::test]
async fn a_duplicate_request_id_is_a_conflict() {
    let service = start(HttpService::builder()).await;
    let addr = service.local_addr();
    let headers = [RESUMABLE, ("x-request-id", "twice")];
    let mut first = open(addr, "POST", "/v1/chat/completions", &headers, Some(&chat(&"y".repeat(300)))).await;
    first.next().await.unwrap();
    let second = open(addr, "POST", "/v1/chat/completions", &headers, Some(&chat("z"))).await;
    assert_eq!(second.status, 409);
}

#[tokio::test]
async fn without_a_reader_generation_stops_after_the_grace_period() {
    let config = StreamsConfig { grace: Duration::from_millis(100), ..Default::default() };
    let service = start(HttpService::builder().streams(config)).await;
    let addr = service.local_addr();
    let headers = [RESUMABLE, ("x-request-id", "abandoned")];
    let mut first = open(addr, "POST", "/v1/chat/completions", &headers, Some(&chat(&"w".repeat(2000)))).await;
    first.next().await.unwrap();
    drop(first);
    bounded("the abandoned stream to be cancelled", async {
        while open(addr, "GET", "/v1/streams/abandoned", &[], None).await.status != 404 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

#[tokio::test]
async fn another_frontend_forwards_a_resume_to_the_owner() {
    let store = Arc::new(MemStore::default());
    let directory = || Arc::new(DiscoveryDirectory::new(Arc::new(MemDiscovery::new(store.clone()))));
    let owner = start(HttpService::builder().stream_directory(directory())).await;
    let other = start(HttpService::builder().stream_directory(directory())).await;

    let headers = [RESUMABLE, ("x-request-id", "roaming")];
    let mut first = open(owner.local_addr(), "POST", "/v1/chat/completions", &headers, Some(&chat(PROMPT))).await;
    let mut before = vec![first.next().await.unwrap(), first.next().await.unwrap()];
    drop(first);
    let last = before.last().unwrap().id.unwrap().to_string();
    let mut resumed = open(other.local_addr(), "GET", "/v1/streams/roaming", &[("last-event-id", &last)], None).await;
    assert_eq!(resumed.status, 200);
    before.extend(resumed.rest().await);
    assert_eq!(text(&before), PROMPT);
    let ids: Vec<u64> = before.iter().map(|e| e.id.unwrap()).collect();
    assert_eq!(ids, (0..before.len() as u64).collect::<Vec<_>>());

    // Cancel through the other frontend too.
    let headers = [RESUMABLE, ("x-request-id", "roaming-2")];
    let mut second =
        open(owner.local_addr(), "POST", "/v1/chat/completions", &headers, Some(&chat(&"v".repeat(500)))).await;
    second.next().await.unwrap();
    assert_eq!(open(other.local_addr(), "DELETE", "/v1/streams/roaming-2", &[], None).await.status, 200);
    assert_ne!(second.rest().await.last().map(|e| e.data.clone()), Some("[DONE]".to_string()));
    assert_eq!(open(other.local_addr(), "GET", "/v1/streams/nobody", &[], None).await.status, 404);
}

//! Shared by the integration tests: a small HTTP/1.1 client over real sockets and
//! scripted test engines.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use dynamo_llm::engine::{
    ChatStream, CompletionStream, EngineError, OpenAIEngine, RequestContext, StreamItem, TokenEngine, TokenStream,
};
use dynamo_llm::protocols::common::{FinishReason, LLMEngineOutput, PreprocessedRequest};
use dynamo_llm::protocols::openai::{
    ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest, ChatDelta, CompletionChoice, CompletionRequest,
    CompletionResponse, Prompt,
};
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Bound on every wait in the tests.
pub const WAIT: Duration = Duration::from_secs(10);

/// `timeout(WAIT, f)`, panicking with `what` when it runs out.
pub async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(WAIT, f).await.unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

/// A whole HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub content_type: String,
    pub body: String,
}

impl HttpResponse {
    /// The body as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
}

/// An open response whose body is read incrementally; dropping it closes the socket.
pub struct OpenResponse {
    pub status: u16,
    pub content_type: String,
    body: Incoming,
    buffer: String,
    connection: JoinHandle<()>,
}

impl Drop for OpenResponse {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

impl OpenResponse {
    /// The next SSE event's `data` (`None` at the end of the body).
    pub async fn next_event(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                let data: Vec<&str> = event.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
                if data.is_empty() {
                    continue; // a comment or keep-alive
                }
                return Some(data.join("\n"));
            }
            let frame = self.body.frame().await?.expect("body frame");
            if let Ok(data) = frame.into_data() {
                self.buffer.push_str(std::str::from_utf8(&data).expect("utf-8 body"));
            }
        }
    }

    /// Every remaining SSE event's data.
    pub async fn all_events(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(e) = self.next_event().await {
            out.push(e);
        }
        out
    }

    /// The rest of the body.
    pub async fn text(mut self) -> String {
        let mut out = std::mem::take(&mut self.buffer);
        while let Some(frame) = self.body.frame().await {
            if let Ok(data) = frame.expect("body frame").into_data() {
                out.push_str(std::str::from_utf8(&data).expect("utf-8 body"));
            }
        }
        out
    }
}

/// Send a request and return once the response head arrived.
pub async fn open(addr: SocketAddr, method: &str, path: &str, body: Option<Vec<u8>>) -> OpenResponse {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await.expect("handshake");
    let connection = tokio::spawn(async move {
        let _ = conn.await;
    });
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.unwrap_or_default())))
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status().as_u16();
    let content_type =
        response.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    OpenResponse { status, content_type, body: response.into_body(), buffer: String::new(), connection }
}

/// Send a request and read the whole response.
pub async fn request(addr: SocketAddr, method: &str, path: &str, body: Option<Vec<u8>>) -> HttpResponse {
    bounded(path, async {
        let open = open(addr, method, path, body).await;
        let (status, content_type) = (open.status, open.content_type.clone());
        HttpResponse { status, content_type, body: open.text().await }
    })
    .await
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    request(addr, "GET", path, None).await
}

/// `POST path` with a JSON body.
pub async fn post(addr: SocketAddr, path: &str, body: &serde_json::Value) -> HttpResponse {
    request(addr, "POST", path, Some(serde_json::to_vec(body).expect("json"))).await
}

/// A chat request for `model` whose last user message is `content`.
pub fn chat_body(model: &str, content: &str, stream: bool) -> serde_json::Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": content}], "stream": stream})
}

/// What a [`ScriptEngine`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineEvent {
    /// A request arrived (its text).
    Started(String),
    /// A waiting request saw its context stopped.
    Stopped(String),
}

/// A script's steps: (content, finish reason, prompt tokens).
type ScriptSteps = futures::stream::BoxStream<'static, Result<(Option<String>, Option<&'static str>, u32), EngineError>>;

/// An engine whose behaviour the prompt picks:
/// - `wait`: one chunk, then wait until the context is stopped (reported), then end;
/// - `fail`: one chunk, then an error item;
/// - `unavailable`: fails the call with `Unavailable`;
/// - `bad`: fails the call with `BadRequest`;
/// - anything else: one chunk per word, then a `stop` chunk.
///
/// Every item carries token counts: prompt = number of words, one completion token per
/// word chunk.
#[derive(Clone)]
pub struct ScriptEngine {
    events: mpsc::UnboundedSender<EngineEvent>,
}

impl ScriptEngine {
    /// The engine and the receiver of its events.
    pub fn new() -> (Arc<Self>, mpsc::UnboundedReceiver<EngineEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Arc::new(ScriptEngine { events: tx }), rx)
    }

    fn script(
        &self,
        text: String,
        ctx: RequestContext,
    ) -> Result<ScriptSteps, EngineError> {
        let _ = self.events.send(EngineEvent::Started(text.clone()));
        let prompt = text.split_whitespace().count() as u32;
        match text.as_str() {
            "unavailable" => Err(EngineError::Unavailable("no capacity".into())),
            "bad" => Err(EngineError::BadRequest("the engine refuses this".into())),
            // A worker that ends its stream without saying why.
            "truncate" => Ok(futures::stream::iter(vec![Ok((Some("partial".to_string()), None, prompt))]).boxed()),
            "fail" => Ok(futures::stream::iter(vec![Ok((Some("partial".to_string()), None, prompt)), Err(EngineError::Internal("engine exploded".into()))]).boxed()),
            "wait" => {
                // The engine's own bookkeeping sees the stop even when nobody polls the
                // stream any more (the frontend dropped it).
                report_stop(&ctx, self.events.clone(), text);
                let first = futures::stream::iter(vec![Ok((Some("waiting".to_string()), None, prompt))]);
                let rest = futures::stream::once(async move {
                    ctx.stopped().await;
                    None
                })
                .filter_map(|x: Option<Result<_, EngineError>>| async move { x });
                Ok(first.chain(rest).boxed())
            }
            _ => {
                let mut items: Vec<Result<_, EngineError>> =
                    text.split_whitespace().map(|w| Ok((Some(format!("{w} ")), None, prompt))).collect();
                items.push(Ok((None, Some("stop"), prompt)));
                Ok(futures::stream::iter(items).boxed())
            }
        }
    }
}

#[async_trait]
impl OpenAIEngine for ScriptEngine {
    async fn chat(&self, request: ChatCompletionRequest, ctx: RequestContext) -> Result<ChatStream, EngineError> {
        let text = request.messages.last().and_then(|m| m.content.as_ref()).map(|c| c.text()).unwrap_or_default();
        let model = request.model.clone();
        let id = format!("chatcmpl-{}", ctx.id());
        let mut first = true;
        let stream = self.script(text, ctx)?.map(move |step| {
            let (content, finish, prompt) = step?;
            let tokens = u32::from(content.is_some());
            let choice = ChatChunkChoice {
                index: 0,
                delta: ChatDelta { role: first.then(|| "assistant".to_string()), content, ..Default::default() },
                finish_reason: finish.map(String::from),
                logprobs: None,
            };
            let prompt_tokens = first.then_some(prompt);
            first = false;
            Ok(StreamItem { data: ChatCompletionChunk::new(&id, &model, 1, choice), prompt_tokens, completion_tokens: tokens, cached_tokens: None })
        });
        Ok(stream.boxed())
    }

    async fn completion(&self, request: CompletionRequest, ctx: RequestContext) -> Result<CompletionStream, EngineError> {
        let text = match &request.prompt {
            Prompt::Text(t) => t.clone(),
            Prompt::TextList(l) => l.join(" "),
            Prompt::Tokens(t) => format!("{} tokens", t.len()),
        };
        let model = request.model.clone();
        let id = format!("cmpl-{}", ctx.id());
        let mut first = true;
        let stream = self.script(text, ctx)?.map(move |step| {
            let (content, finish, prompt) = step?;
            let tokens = u32::from(content.is_some());
            let choice = CompletionChoice { index: 0, text: content.unwrap_or_default(), finish_reason: finish.map(String::from), logprobs: None };
            let prompt_tokens = first.then_some(prompt);
            first = false;
            Ok(StreamItem { data: CompletionResponse::new(&id, &model, 1, choice), prompt_tokens, completion_tokens: tokens, cached_tokens: None })
        });
        Ok(stream.boxed())
    }
}

/// Report `Stopped(text)` once when `ctx` is stopped or killed.
fn report_stop(ctx: &RequestContext, events: mpsc::UnboundedSender<EngineEvent>, text: String) {
    let once = std::sync::atomic::AtomicBool::new(false);
    ctx.on_change(move |_| {
        if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let _ = events.send(EngineEvent::Stopped(text.clone()));
        }
    });
}

/// A token engine that echoes the prompt's token ids one per step (then `stop`), or,
/// for the prompt `[0]`, waits until stopped and reports the stop.
#[derive(Clone)]
pub struct EchoTokenEngine {
    pub stopped: mpsc::UnboundedSender<String>,
}

#[async_trait]
impl TokenEngine for EchoTokenEngine {
    async fn generate(&self, request: PreprocessedRequest, ctx: RequestContext) -> Result<TokenStream, EngineError> {
        if request.token_ids == [0] {
            let stopped = self.stopped.clone();
            let once = std::sync::atomic::AtomicBool::new(false);
            let id = ctx.id().to_string();
            ctx.on_change(move |_| {
                if !once.swap(true, std::sync::atomic::Ordering::SeqCst) {
                    let _ = stopped.send(id.clone());
                }
            });
            let first = futures::stream::iter(vec![Ok(LLMEngineOutput { token_ids: vec![0], ..Default::default() })]);
            let rest = futures::stream::once(async move {
                ctx.stopped().await;
                None
            })
            .filter_map(|x: Option<Result<LLMEngineOutput, EngineError>>| async move { x });
            return Ok(first.chain(rest).boxed());
        }
        let mut items: Vec<Result<LLMEngineOutput, EngineError>> =
            request.token_ids.iter().map(|t| Ok(LLMEngineOutput { token_ids: vec![*t], ..Default::default() })).collect();
        items.push(Ok(LLMEngineOutput { finish_reason: Some(FinishReason::Stop), ..Default::default() }));
        Ok(futures::stream::iter(items).boxed())
    }
}

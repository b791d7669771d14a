//! The request and response planes: the process's TCP server, its outbound connection
//! pool, the table of streams it awaits (caller role) and of endpoints it serves
//! (worker role). NATS carries requests in `nats.rs`; responses always come back over TCP.

pub mod connection;
pub mod frame;
pub(crate) mod nats;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, OnceCell};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::RequestContext;
use crate::error::{Error, ErrorKind, Result};
use crate::events::EventHub;
use crate::handler::{IncomingRequest, RequestHandler, Responder};
use crate::metrics::EndpointMetrics;
use crate::response_stream::{ResponseItem, ResponseStream, StreamEvent};
use connection::Connection;
use frame::{Frame, FrameKind};

/// Items buffered per awaited stream before the connection's reader waits for the consumer.
const STREAM_BUFFER: usize = 1024;

/// Transport limits taken from the runtime configuration.
#[derive(Debug, Clone)]
pub(crate) struct TransportConfig {
    pub max_message_size: usize,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
}

/// Header of a Request frame.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct RequestHeader {
    /// `namespace/component/endpoint`.
    pub endpoint: String,
    /// Request id, propagated to the handler's context.
    pub id: String,
    /// NATS plane only: where the worker connects back with the response stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply: Option<String>,
}

/// An endpoint this process serves.
pub(crate) struct ServedEndpoint {
    pub handler: Arc<dyn RequestHandler>,
    pub metrics: Arc<EndpointMetrics>,
    pub draining: AtomicBool,
}

struct Pending {
    tx: mpsc::Sender<StreamEvent>,
    conn: Option<Arc<Connection>>,
    /// For a stream not yet bound to a connection: when to give up on the worker.
    deadline: Option<std::time::Instant>,
}

/// The process-wide transport state shared by every connection.
pub struct Transport {
    pub(crate) config: TransportConfig,
    pub(crate) instance_id: u64,
    pub(crate) cancel: CancellationToken,
    pub(crate) tracker: TaskTracker,
    pub(crate) events: EventHub,
    shutting_down: AtomicBool,
    address: String,
    next_stream: AtomicU64,
    pending: Mutex<HashMap<u64, Pending>>,
    endpoints: RwLock<HashMap<String, Arc<ServedEndpoint>>>,
    pool: Mutex<HashMap<String, Arc<OnceCell<Arc<Connection>>>>>,
    /// NATS plane, caller side: the inbox prefix refusals are sent to, once set up.
    pub(crate) nats_inbox: OnceCell<String>,
}

impl Transport {
    /// Bind the TCP server on `host:port` and start accepting.
    pub(crate) async fn bind(
        config: TransportConfig,
        instance_id: u64,
        host: &str,
        port: u16,
        cancel: CancellationToken,
        tracker: TaskTracker,
    ) -> Result<Arc<Transport>> {
        let listener = TcpListener::bind((host, port)).await.map_err(|e| {
            Error::with_source(ErrorKind::Config, format!("cannot listen on {host}:{port} (DYN_TCP_HOST/DYN_TCP_PORT)"), e)
        })?;
        let local = listener.local_addr()?;
        let address = if host.contains(':') { format!("[{host}]:{}", local.port()) } else { format!("{host}:{}", local.port()) };
        let transport = Arc::new(Transport {
            config,
            instance_id,
            cancel: cancel.clone(),
            tracker: tracker.clone(),
            events: EventHub::default(),
            shutting_down: AtomicBool::new(false),
            address,
            next_stream: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            endpoints: RwLock::new(HashMap::new()),
            pool: Mutex::new(HashMap::new()),
            nats_inbox: OnceCell::new(),
        });
        let weak = Arc::downgrade(&transport);
        tracker.spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = cancel.cancelled() => return,
                };
                let Some(transport) = weak.upgrade() else { return };
                match accepted {
                    Ok((socket, peer)) => {
                        Connection::spawn(&transport, socket, peer.to_string(), false);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
        Ok(transport)
    }

    /// Mark the process as shutting down; returns whether it already was.
    pub(crate) fn begin_shutdown(&self) -> bool {
        self.shutting_down.swap(true, Ordering::AcqRel)
    }

    /// Whether the process is shutting down (watches ending then are expected).
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// The `host:port` other processes reach this one at.
    pub fn address(&self) -> &str {
        &self.address
    }

    // ---- worker role ---------------------------------------------------------------

    pub(crate) fn add_endpoint(&self, path: &str, endpoint: Arc<ServedEndpoint>) -> Result<()> {
        let mut eps = self.endpoints.write();
        if eps.contains_key(path) {
            return Err(Error::new(ErrorKind::AlreadyExists, format!("endpoint {path} is already served by this process")));
        }
        eps.insert(path.to_string(), endpoint);
        Ok(())
    }

    pub(crate) fn remove_endpoint(&self, path: &str) {
        self.endpoints.write().remove(path);
    }

    /// Serve a Request frame that arrived on `conn` (TCP plane) or whose responses go to
    /// `conn` (NATS plane).
    pub(crate) fn on_request(self: &Arc<Self>, conn: &Arc<Connection>, stream: u64, header: RequestHeader, body: Bytes) {
        let endpoint = self.endpoints.read().get(&header.endpoint).cloned();
        let reject = |kind: ErrorKind, message: String| {
            let h = serde_json::json!({"kind": kind.as_str(), "message": message});
            conn.send_reliably(self, Frame::with_header(FrameKind::Error, stream, serde_json::to_vec(&h).unwrap_or_default().into(), Bytes::new()));
        };
        let Some(endpoint) = endpoint else {
            return reject(
                ErrorKind::UnknownEndpoint,
                format!("endpoint {} is not served by instance {:x}", header.endpoint, self.instance_id),
            );
        };
        if endpoint.draining.load(Ordering::Acquire) {
            return reject(ErrorKind::Unavailable, format!("instance {:x} is shutting down", self.instance_id));
        }
        let context = RequestContext::new(header.id);
        if conn.add_running(stream, context.clone()).is_err() {
            return;
        }
        let responder = Responder::new(self.clone(), conn.clone(), stream, context.clone(), endpoint.metrics.clone());
        endpoint.handler.handle(IncomingRequest { body, context }, responder);
    }

    // ---- caller role ---------------------------------------------------------------

    /// Register a stream to await; `conn` is where it arrives, if already known.
    pub(crate) fn open_stream(self: &Arc<Self>, conn: Option<&Arc<Connection>>) -> Result<ResponseStream> {
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        if let Some(c) = conn {
            c.bind(id)?;
        }
        let deadline = conn.is_none().then(|| std::time::Instant::now() + self.config.response_timeout);
        self.pending.lock().insert(id, Pending { tx, conn: conn.cloned(), deadline });
        Ok(ResponseStream::new(id, rx, self.clone()))
    }

    /// Send a request over the TCP plane to the instance at `address`.
    pub(crate) async fn send_tcp(self: &Arc<Self>, address: &str, endpoint: &str, request_id: &str, body: Bytes) -> Result<ResponseStream> {
        let header = serde_json::to_vec(&RequestHeader { endpoint: endpoint.to_string(), id: request_id.to_string(), reply: None })?;
        let frame = Frame::with_header(FrameKind::Request, 0, header.into(), body);
        self.check_size(frame.encoded_len(), "TCP request plane (DYN_TCP_MAX_MESSAGE_SIZE)", self.config.max_message_size)?;
        let conn = self.connection(address).await?;
        let stream = self.open_stream(Some(&conn))?;
        let frame = Frame { stream: stream.id(), ..frame };
        conn.send(frame).await?;
        Ok(stream)
    }

    pub(crate) fn check_size(&self, size: usize, plane: &str, limit: usize) -> Result<()> {
        if size > limit {
            return Err(Error::new(
                ErrorKind::PayloadTooLarge,
                format!("request of {size} bytes exceeds the {limit}-byte limit of the {plane}"),
            ));
        }
        Ok(())
    }

    /// Deliver a response frame to the stream awaiting it.
    async fn route_response(self: &Arc<Self>, conn: &Arc<Connection>, frame: Frame) {
        let id = frame.stream;
        let event = match frame.kind {
            FrameKind::Item => StreamEvent::Item(ResponseItem { header: frame.header, body: frame.body }),
            FrameKind::End => StreamEvent::End,
            _ => StreamEvent::Error(decode_error(&frame.header)),
        };
        let terminal = !matches!(event, StreamEvent::Item(_));
        let tx = {
            let mut pending = self.pending.lock();
            if terminal {
                pending.remove(&id).map(|p| p.tx)
            } else {
                pending.get(&id).map(|p| p.tx.clone())
            }
        };
        if terminal {
            conn.unbind(id);
        }
        let delivered = match tx {
            Some(tx) => tx.send(event).await.is_ok(),
            None => false,
        };
        if !delivered && !terminal {
            // Nobody reads this stream any more: tell the worker to drop it.
            self.abandon(id);
            conn.send_reliably(self, Frame::control(FrameKind::Kill, id));
        }
    }

    /// The worker took stream `id` and will answer on `conn` (NATS plane).
    fn on_start(&self, conn: &Arc<Connection>, id: u64) {
        let mut pending = self.pending.lock();
        match pending.get_mut(&id) {
            Some(p) if conn.bind(id).is_ok() => p.conn = Some(conn.clone()),
            _ => {
                drop(pending);
                conn.send_reliably(self, Frame::control(FrameKind::Kill, id));
            }
        }
    }

    /// End an awaited stream with `error` (connection lost, timeout).
    pub(crate) fn fail_pending(&self, id: u64, error: Error) {
        if let Some(p) = self.pending.lock().remove(&id) {
            if let Some(c) = &p.conn {
                c.unbind(id);
            }
            let _ = p.tx.try_send(StreamEvent::Error(error));
        }
    }

    /// End every stream whose worker has not connected back within the response timeout.
    pub(crate) fn fail_expired(&self) {
        let now = std::time::Instant::now();
        let expired: Vec<u64> = self
            .pending
            .lock()
            .iter()
            .filter(|(_, p)| p.conn.is_none() && p.deadline.is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.fail_pending(
                id,
                Error::new(
                    ErrorKind::Timeout,
                    format!("no worker took the request within {:?} (DYN_RESPONSE_TIMEOUT)", self.config.response_timeout),
                ),
            );
        }
    }

    /// End every awaited stream: the runtime is shutting down.
    pub(crate) fn fail_all_pending(&self) {
        let pending: Vec<Pending> = self.pending.lock().drain().map(|(_, p)| p).collect();
        for p in pending {
            let _ = p.tx.try_send(StreamEvent::Error(Error::new(ErrorKind::Shutdown, "the runtime shut down")));
        }
    }

    /// Whether stream `id` is awaited but not yet bound to a connection.
    pub(crate) fn is_unbound(&self, id: u64) -> bool {
        self.pending.lock().get(&id).map(|p| p.conn.is_none()).unwrap_or(false)
    }

    /// Send Stop or Kill for an awaited stream to the worker serving it.
    pub(crate) fn control(&self, id: u64, kind: FrameKind) {
        let conn = self.pending.lock().get(&id).and_then(|p| p.conn.clone());
        if let Some(conn) = conn {
            conn.send_reliably(self, Frame::control(kind, id));
        }
    }

    /// The caller dropped stream `id`: forget it and kill it on the worker.
    pub(crate) fn abandon(&self, id: u64) {
        let removed = self.pending.lock().remove(&id);
        if let Some(Pending { conn: Some(conn), .. }) = removed {
            conn.unbind(id);
            conn.send_reliably(self, Frame::control(FrameKind::Kill, id));
        }
    }

    // ---- connections ---------------------------------------------------------------

    /// A pooled connection to `address`, opened (bounded by the connect timeout) if needed.
    pub(crate) async fn connection(self: &Arc<Self>, address: &str) -> Result<Arc<Connection>> {
        for _ in 0..2 {
            let cell = self.pool.lock().entry(address.to_string()).or_default().clone();
            let conn = cell
                .get_or_try_init(|| async {
                    let connect = tokio::net::TcpStream::connect(address);
                    let bounded = tokio::time::timeout(self.config.connect_timeout, connect);
                    let socket = tokio::select! {
                        r = bounded => r,
                        _ = self.cancel.cancelled() => return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down")),
                    }
                        .map_err(|_| {
                            Error::new(ErrorKind::Unavailable, format!("connecting to {address} timed out after {:?}", self.config.connect_timeout))
                        })?
                        .map_err(|e| Error::with_source(ErrorKind::Unavailable, format!("cannot connect to {address}"), e))?;
                    Ok::<_, Error>(Connection::spawn(self, socket, address.to_string(), true))
                })
                .await;
            match conn {
                Ok(c) if !c.is_closed() => return Ok(c.clone()),
                Ok(c) => {
                    let c = c.clone();
                    self.forget_connection(&c);
                }
                Err(e) => {
                    self.forget_address(address, &cell);
                    return Err(e);
                }
            }
        }
        Err(Error::new(ErrorKind::Unavailable, format!("connection to {address} keeps closing")))
    }

    fn forget_address(&self, address: &str, cell: &Arc<OnceCell<Arc<Connection>>>) {
        let mut pool = self.pool.lock();
        if pool.get(address).map(|c| Arc::ptr_eq(c, cell)).unwrap_or(false) {
            pool.remove(address);
        }
    }

    pub(crate) fn forget_connection(&self, conn: &Connection) {
        let mut pool = self.pool.lock();
        let same = pool.get(conn.peer()).and_then(|c| c.get()).map(|c| c.id() == conn.id()).unwrap_or(false);
        if same {
            pool.remove(conn.peer());
        }
    }

    /// Route one frame read from `conn`.
    pub(crate) async fn route(self: &Arc<Self>, conn: &Arc<Connection>, frame: Frame) {
        match frame.kind {
            FrameKind::Request => match serde_json::from_slice::<RequestHeader>(&frame.header) {
                Ok(header) => self.on_request(conn, frame.stream, header, frame.body),
                Err(e) => {
                    let h = serde_json::json!({"kind": "protocol", "message": format!("malformed request header: {e}")});
                    conn.send_reliably(self, Frame::with_header(FrameKind::Error, frame.stream, serde_json::to_vec(&h).unwrap_or_default().into(), Bytes::new()));
                }
            },
            FrameKind::Start => self.on_start(conn, frame.stream),
            FrameKind::Item | FrameKind::End | FrameKind::Error => self.route_response(conn, frame).await,
            FrameKind::Stop => {
                if let Some(ctx) = conn.running(frame.stream) {
                    ctx.stop_generating();
                }
            }
            FrameKind::Kill => {
                if let Some(ctx) = conn.running(frame.stream) {
                    ctx.kill();
                }
            }
            FrameKind::Subscribe => self.events.add_remote_subscriber(conn, frame.stream, &frame.header),
            FrameKind::Event => self.events.deliver(frame.stream, frame.header, frame.body),
            FrameKind::Hello => tracing::debug!(peer = %conn.peer(), "ignoring a repeated Hello"),
        }
    }
}

fn decode_error(header: &[u8]) -> Error {
    #[derive(Deserialize)]
    struct ErrorHeader {
        kind: String,
        message: String,
    }
    match serde_json::from_slice::<ErrorHeader>(header) {
        Ok(h) => Error::new(ErrorKind::parse(&h.kind), h.message),
        Err(_) => Error::new(ErrorKind::Protocol, format!("malformed error frame: {}", String::from_utf8_lossy(header))),
    }
}

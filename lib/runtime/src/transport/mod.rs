//! The request and response planes. `Transport` is the process-wide facade over the TCP
//! server and worker role (`server.rs`), the streams it awaits as a caller
//! (`pending.rs`) and its outbound connection pool (`pool.rs`). NATS carries requests in
//! `nats.rs`; responses always come back over TCP.
//!
//! A connection is a framed socket (`connection.rs`) that knows nothing of what its
//! frames mean; the transport owns each one as a `Link` (`link.rs`: the socket and the
//! streams bound to it), reads its frames on one task and routes them (`reader.rs`,
//! `Transport::route`), and keeps it alive (`keepalive.rs`).

pub mod connection;
pub(crate) mod dispatch;
pub(crate) mod inflight;
pub mod frame;
mod keepalive;
pub(crate) mod link;
mod liveness;
pub(crate) mod nats;
pub(crate) mod nats_connection;
mod peer_health;
mod pending;
mod pool;
mod reader;
pub mod responder;
pub mod response_stream;
mod server;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{Error, ErrorKind, Result};
use response_stream::ResponseStream;
use dispatch::{FrameHandler, FrameHandlers};
use frame::{Frame, FrameKind};
use link::Link;
use peer_health::PeerHealth;
use pending::PendingStreams;
use pool::ConnectionPool;
pub(crate) use server::ServedEndpoint;

/// Transport limits taken from the runtime configuration.
#[derive(Debug, Clone)]
pub(crate) struct TransportConfig {
    pub max_message_size: usize,
    pub connect_timeout: Duration,
    pub response_timeout: Duration,
    /// A quiet connection is pinged after this long.
    pub ping_interval: Duration,
    /// A connection silent for this long is declared dead.
    pub peer_timeout: Duration,
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

/// The process-wide transport state shared by every connection.
pub struct Transport {
    pub(crate) config: TransportConfig,
    pub(crate) instance_id: u64,
    pub(crate) cancel: CancellationToken,
    pub(crate) tracker: TaskTracker,
    /// Handlers of the frame kinds other rooms own (the event plane registers its own).
    pub(crate) frame_handlers: FrameHandlers,
    shutting_down: AtomicBool,
    address: String,
    pending: PendingStreams,
    endpoints: RwLock<HashMap<String, Arc<ServedEndpoint>>>,
    pool: ConnectionPool,
    health: PeerHealth,
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
            tracker,
            frame_handlers: FrameHandlers::default(),
            shutting_down: AtomicBool::new(false),
            address,
            pending: PendingStreams::default(),
            endpoints: RwLock::new(HashMap::new()),
            pool: ConnectionPool::default(),
            health: PeerHealth::default(),
            nats_inbox: OnceCell::new(),
        });
        server::spawn_accept_loop(&transport, listener, cancel);
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

    /// Route frames of `kinds` to `handler` (see [`dispatch`]).
    pub(crate) fn register_frames(&self, kinds: &[FrameKind], handler: Arc<dyn FrameHandler>) {
        self.frame_handlers.register(kinds, handler);
    }

    /// Route one frame read from `conn`.
    pub(crate) async fn route(self: &Arc<Self>, conn: &Arc<Link>, frame: Frame) {
        match frame.kind {
            FrameKind::Request => match serde_json::from_slice::<RequestHeader>(&frame.header) {
                Ok(header) => self.on_request(conn, frame.stream, header, frame.body),
                Err(e) => self.reject(conn, frame.stream, ErrorKind::Protocol, &format!("malformed request header: {e}")),
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
            FrameKind::Subscribe | FrameKind::Event | FrameKind::SubscribeSync | FrameKind::Subscribed => {
                match self.frame_handlers.get(frame.kind) {
                    Some(handler) => handler.on_frame(conn, frame).await,
                    None => tracing::debug!(peer = %conn.peer(), kind = ?frame.kind, "no handler for this frame kind; ignored"),
                }
            }
            FrameKind::Hello => tracing::debug!(peer = %conn.peer(), "ignoring a repeated Hello"),
            // Answered by the connection's reader before routing.
            FrameKind::Ping | FrameKind::Pong => {}
        }
    }
}

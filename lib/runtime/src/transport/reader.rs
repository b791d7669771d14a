//! The owner's side of a connection: open a [`Link`] for a socket (the side that opened
//! it sends Hello first), read its frames on one task — answering Ping and noting Pong
//! right there, so that a busy handler (or a Python worker holding the GIL) never
//! delays them, and routing the rest with `Transport::route` — and close it, failing
//! the streams awaited on it and killing the ones served on it.

use std::sync::Arc;

use tokio::net::TcpStream;

use super::connection::{Connection, FrameReader};
use super::frame::{Frame, FrameKind, PROTOCOL_VERSION};
use super::keepalive;
use super::link::Link;
use super::Transport;
use crate::error::{Error, ErrorKind, Result};

impl Transport {
    /// Take charge of an established socket: its writer, reader and keepalive tasks.
    /// `outbound` links send the Hello frame first; inbound ones expect it.
    pub(crate) fn attach(self: &Arc<Self>, socket: TcpStream, peer: String, outbound: bool) -> Arc<Link> {
        let (conn, reader) = Connection::open(socket, peer, outbound, self.config.max_message_size, &self.cancel, &self.tracker);
        if outbound {
            let _ = conn.try_send(hello(self.instance_id));
        }
        let link = Arc::new(Link::new(conn));
        let (transport, reading) = (self.clone(), link.clone());
        self.tracker.spawn(async move { transport.read_frames(reading, reader).await });
        keepalive::spawn(self, &link);
        link
    }

    async fn read_frames(self: Arc<Self>, link: Arc<Link>, mut reader: FrameReader) {
        let mut greeted = link.is_outbound();
        let reason = loop {
            let next = tokio::select! {
                n = reader.read_frame() => n,
                _ = link.closed_token().cancelled() => break "connection closed".to_string(),
            };
            let frame = match next {
                Ok(Some(frame)) => frame,
                Ok(None) => break "peer closed the connection".to_string(),
                Err(e) => break e.message().to_string(),
            };
            if !greeted {
                match check_hello(&frame) {
                    Ok(instance) => {
                        link.set_peer_instance(instance);
                        greeted = true;
                        continue;
                    }
                    Err(e) => break e.to_string(),
                }
            }
            match frame.kind {
                FrameKind::Ping => {
                    let _ = link.try_send(Frame::control(FrameKind::Pong, 0));
                }
                FrameKind::Pong => link.liveness().pong_received(),
                _ => {
                    link.liveness().set_reader_busy(true);
                    self.route(&link, frame).await;
                    link.liveness().set_reader_busy(false);
                }
            }
        };
        self.close_link(&link, &reason);
    }

    /// Close `link`: fail every stream awaited on it and kill every stream served on it.
    pub(crate) fn close_link(&self, link: &Link, reason: &str) {
        // Take the streams before waking the reader and writer, so that the first
        // closer's reason is the one the streams report (the reader, woken, closes too).
        let streams = link.take_streams();
        link.close();
        if !streams.awaited.is_empty() || !streams.served.is_empty() {
            tracing::warn!(peer = %link.peer(), reason, awaited = streams.awaited.len(), served = streams.served.len(), "connection lost");
        } else {
            tracing::debug!(peer = %link.peer(), reason, "connection closed");
        }
        for id in streams.awaited {
            self.fail_pending(
                id,
                Error::new(ErrorKind::Disconnected, format!("connection to {} lost mid-stream: {reason}", link.peer())),
            );
        }
        for ctx in streams.served.into_values() {
            ctx.kill();
        }
        self.frame_handlers.connection_closed(link.id());
        self.forget_connection(link);
    }
}

/// The first frame on an outbound connection: protocol version and instance id.
fn hello(instance_id: u64) -> Frame {
    let hello = serde_json::json!({"version": PROTOCOL_VERSION, "instance_id": instance_id});
    Frame::with_header(FrameKind::Hello, 0, serde_json::to_vec(&hello).unwrap_or_default().into(), Default::default())
}

/// Check a Hello frame; returns the peer's instance id.
fn check_hello(frame: &Frame) -> Result<u64> {
    if frame.kind != FrameKind::Hello {
        return Err(Error::new(ErrorKind::Protocol, format!("expected Hello, got {:?}", frame.kind)));
    }
    let hello: serde_json::Value = serde_json::from_slice(&frame.header)?;
    let version = hello.get("version").and_then(|v| v.as_u64()).unwrap_or(0);
    if version != PROTOCOL_VERSION as u64 {
        return Err(Error::new(
            ErrorKind::Protocol,
            format!("peer speaks protocol version {version}, this runtime speaks {PROTOCOL_VERSION}"),
        ));
    }
    Ok(hello.get("instance_id").and_then(|v| v.as_u64()).unwrap_or(0))
}

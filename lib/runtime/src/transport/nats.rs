//! The NATS request plane: a request is a NATS request on the instance's own subject;
//! the worker acknowledges, connects back to the caller's TCP server and streams the
//! response there (Start, Items, End/Error), exactly as on the TCP plane.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::frame::{Frame, FrameKind};
use super::{RequestHeader, Transport};
use crate::error::{Error, ErrorKind, Result};
use crate::response_stream::ResponseStream;

/// Make a string safe as one NATS subject token.
pub(crate) fn subject_token(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' }).collect()
}

/// The per-instance subject of an endpoint.
pub(crate) fn instance_subject(namespace: &str, component: &str, endpoint: &str, instance_id: u64) -> String {
    format!("dynamo.{}.{}.{}.{instance_id:x}", subject_token(namespace), subject_token(component), subject_token(endpoint))
}

/// Serve requests arriving on `subject` until `cancel` fires.
pub(crate) async fn serve(client: async_nats::Client, transport: Arc<Transport>, subject: String, cancel: CancellationToken) -> Result<()> {
    let mut sub = client
        .subscribe(subject.clone())
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("cannot subscribe to {subject}"), e))?;
    let tracker = transport.tracker.clone();
    tracker.spawn(async move {
        loop {
            let msg = tokio::select! {
                m = sub.next() => m,
                _ = cancel.cancelled() => break,
            };
            let Some(msg) = msg else {
                tracing::error!(subject, "NATS subscription ended; this endpoint no longer receives requests");
                break;
            };
            let client = client.clone();
            let transport = transport.clone();
            transport.tracker.clone().spawn(async move {
                let reply = msg.reply.clone();
                let ack = match accept(&transport, msg.payload).await {
                    Ok(()) => serde_json::json!({"ok": true}),
                    Err(e) => serde_json::json!({"kind": e.kind().as_str(), "message": e.full_message()}),
                };
                if let Some(reply) = reply {
                    let _ = client.publish(reply, serde_json::to_vec(&ack).unwrap_or_default().into()).await;
                }
            });
        }
        let _ = sub.unsubscribe().await;
    });
    Ok(())
}

async fn accept(transport: &Arc<Transport>, payload: Bytes) -> Result<()> {
    let frame = Frame::decode_prefixed(payload)?;
    if frame.kind != FrameKind::Request {
        return Err(Error::new(ErrorKind::Protocol, format!("expected a Request frame, got {:?}", frame.kind)));
    }
    let header: RequestHeader = serde_json::from_slice(&frame.header)?;
    let reply = header
        .reply
        .clone()
        .ok_or_else(|| Error::new(ErrorKind::Protocol, "NATS request without a reply address"))?;
    let conn = transport.connection(&reply).await?;
    conn.send(Frame::control(FrameKind::Start, frame.stream)).await?;
    transport.on_request(&conn, frame.stream, header, frame.body);
    Ok(())
}

/// Send a request to `subject` and return the stream the worker will connect back with.
pub(crate) async fn send(
    client: &async_nats::Client,
    transport: &Arc<Transport>,
    subject: &str,
    endpoint: &str,
    request_id: &str,
    body: Bytes,
) -> Result<ResponseStream> {
    let stream = transport.open_stream(None)?;
    let header = RequestHeader { endpoint: endpoint.to_string(), id: request_id.to_string(), reply: Some(transport.address().to_string()) };
    let frame = Frame::with_header(FrameKind::Request, stream.id(), serde_json::to_vec(&header)?.into(), body);
    let max = client.server_info().max_payload;
    transport.check_size(frame.encoded_len(), "NATS request plane (the server's max_payload)", max)?;
    // The stream is returned at once; the acknowledgement is awaited in a task. A
    // refusal or no responders ends the stream with `Unavailable` before any item, which
    // the client turns into a retry on another instance. Waiting for the ack here would
    // put a second trip through nats-server on every request's critical path.
    let id = stream.id();
    let subject = subject.to_string();
    let client = client.clone();
    let watched = transport.clone();
    let cancel = transport.cancel.clone();
    transport.tracker.spawn(async move {
        let timeout = watched.config.response_timeout;
        let acknowledged = tokio::select! {
            r = tokio::time::timeout(timeout, client.request(subject.clone(), frame.to_bytes())) => r,
            _ = cancel.cancelled() => return,
        };
        let outcome = match acknowledged {
            Err(_) => Err(Error::new(ErrorKind::Timeout, format!("no acknowledgement from {subject} within {timeout:?}"))),
            Ok(Err(e)) => Err(match e.kind() {
                async_nats::client::RequestErrorKind::NoResponders => {
                    Error::new(ErrorKind::Unavailable, format!("no worker listens on {subject}"))
                }
                _ => Error::with_source(ErrorKind::Nats, format!("NATS request to {subject} failed"), e),
            }),
            Ok(Ok(answer)) => parse_ack(&answer.payload),
        };
        if let Err(e) = outcome {
            // A worker that already connected back took the stream; a lost ack is moot.
            if watched.is_unbound(id) {
                watched.fail_pending(id, e);
            }
            return;
        }
        // Bound the wait for the worker's connection: a worker that dies after
        // acknowledging must not leave the caller waiting forever.
        if !watched.is_unbound(id) {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(timeout) => {}
            _ = cancel.cancelled() => return,
        }
        if watched.is_unbound(id) {
            watched.fail_pending(
                id,
                Error::new(ErrorKind::Timeout, format!("worker on {subject} acknowledged but did not connect back within {timeout:?}")),
            );
        }
    });
    Ok(stream)
}

fn parse_ack(payload: &[u8]) -> Result<()> {
    let ack: serde_json::Value = serde_json::from_slice(payload)?;
    if ack.get("ok").and_then(|v| v.as_bool()) == Some(true) {
        return Ok(());
    }
    let kind = ack.get("kind").and_then(|v| v.as_str()).unwrap_or("protocol");
    let message = ack.get("message").and_then(|v| v.as_str()).unwrap_or("malformed acknowledgement");
    Err(Error::new(ErrorKind::parse(kind), message.to_string()))
}

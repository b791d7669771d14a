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
use super::response_stream::ResponseStream;

/// How often streams whose worker never answered are checked against their deadline.
const SWEEP_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

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
    // The instance is registered in discovery once this returns: the server must have the
    // SUB by then, or a caller's first request could find no responder.
    let mut sub = crate::nats::subscribe_confirmed(&client, &subject).await?;
    let tracker = transport.tracker.clone();
    tracker.spawn(async move {
        loop {
            let msg = tokio::select! {
                m = sub.next() => m,
                _ = cancel.cancelled() => break,
            };
            // An outage only pauses the subscription (the client resubscribes after it
            // reconnects); it ends when the connection is closed for good.
            let Some(msg) = msg else {
                tracing::error!(subject, "NATS subscription ended; this endpoint no longer receives requests");
                break;
            };
            let client = client.clone();
            let transport = transport.clone();
            transport.tracker.clone().spawn(async move {
                if is_ping(&msg.payload) {
                    // A caller's liveness probe (see [`ping`]): answering shows this
                    // process takes messages from its subject again.
                    if let Some(reply) = msg.reply {
                        let _ = client.publish(reply, Frame::control(FrameKind::Pong, 0).to_bytes()).await;
                    }
                    return;
                }
                // Acceptance is the Start frame on the TCP connection; only a refusal is
                // answered over NATS, keeping a second nats-server hop off every request.
                if let Err(e) = accept(&transport, msg.payload).await {
                    if let Some(reply) = msg.reply {
                        let refusal = serde_json::json!({"kind": e.kind().as_str(), "message": e.full_message()});
                        let _ = client.publish(reply, serde_json::to_vec(&refusal).unwrap_or_default().into()).await;
                    }
                }
            });
        }
        let _ = sub.unsubscribe().await;
    });
    Ok(())
}

fn is_ping(payload: &Bytes) -> bool {
    Frame::decode_prefixed(payload.clone()).is_ok_and(|f| f.kind == FrameKind::Ping)
}

/// Whether the instance serving `subject` answers a ping within `timeout`: it takes
/// messages from its subject. Any answer counts (a worker of an older version refuses
/// the ping, which shows it is alive just the same).
pub(crate) async fn ping(client: &async_nats::Client, subject: &str, timeout: std::time::Duration) -> bool {
    let request = client.request(subject.to_string(), Frame::control(FrameKind::Ping, 0).to_bytes());
    matches!(tokio::time::timeout(timeout, request).await, Ok(Ok(_)))
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
///
/// The stream is returned at once. The worker's Start frame (on TCP) says it took the
/// request; a refusal, or NATS's no-responders status, arrives on this process's inbox
/// and ends the stream with an error before any item (the client then resends the
/// request elsewhere). A worker that does neither within the response timeout ends the
/// stream with `Timeout`.
pub(crate) async fn send(
    client: &async_nats::Client,
    transport: &Arc<Transport>,
    subject: &str,
    endpoint: &str,
    request_id: &str,
    body: Bytes,
) -> Result<ResponseStream> {
    let inbox = transport.nats_inbox.get_or_try_init(|| start_reply_router(client, transport)).await?;
    let max = client.server_info().max_payload;
    let header = RequestHeader { endpoint: endpoint.to_string(), id: request_id.to_string(), reply: Some(transport.address().to_string()) };
    let header = Bytes::from(serde_json::to_vec(&header)?);
    let size = Frame::with_header(FrameKind::Request, 0, header.clone(), body.clone()).encoded_len();
    transport.check_size(size, "NATS request plane (the server's max_payload)", max)?;
    let stream = transport.open_stream(None)?;
    let frame = Frame::with_header(FrameKind::Request, stream.id(), header, body);
    client
        .publish_with_reply(subject.to_string(), format!("{inbox}.{}", stream.id()), frame.to_bytes())
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, format!("publishing the request to {subject} failed"), e))?;
    Ok(stream)
}

/// Subscribe to this process's reply inbox and route refusals to their streams; sweep
/// streams whose worker never answered. Returns the inbox prefix.
async fn start_reply_router(client: &async_nats::Client, transport: &Arc<Transport>) -> Result<String> {
    let prefix = client.new_inbox();
    let mut replies = client
        .subscribe(format!("{prefix}.*"))
        .await
        .map_err(|e| Error::with_source(ErrorKind::Nats, "cannot subscribe to the reply inbox", e))?;
    let cancel = transport.cancel.clone();
    let routed = transport.clone();
    transport.tracker.spawn(async move {
        loop {
            let msg = tokio::select! {
                m = replies.next() => m,
                _ = cancel.cancelled() => return,
            };
            let Some(msg) = msg else { return };
            let Some(id) = msg.subject.rsplit('.').next().and_then(|s| s.parse::<u64>().ok()) else { continue };
            let refusal = if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                Error::new(ErrorKind::Unavailable, "no worker listens on the instance's NATS subject any more")
            } else {
                match parse_ack(&msg.payload) {
                    Ok(()) => continue,
                    Err(e) => e,
                }
            };
            // A worker that already connected back took the stream.
            if routed.is_unbound(id) {
                routed.fail_pending(id, refusal);
            }
        }
    });
    let cancel = transport.cancel.clone();
    let swept = transport.clone();
    transport.tracker.spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tokio::select! {
                _ = tick.tick() => swept.fail_expired(),
                _ = cancel.cancelled() => return,
            }
        }
    });
    Ok(prefix)
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

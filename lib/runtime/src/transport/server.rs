//! The worker role of the transport: the TCP accept loop and serving the Request
//! frames that arrive (TCP plane) or whose responses go out (NATS plane) on a connection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::frame::{Frame, FrameKind};
use super::inflight::InflightStreams;
use super::link::Link;
use super::responder::{IncomingRequest, RequestHandler, Responder};
use super::{RequestHeader, Transport};
use crate::context::RequestContext;
use crate::error::{Error, ErrorKind, Result};
use crate::metrics::EndpointMetrics;

/// An endpoint this process serves.
pub(crate) struct ServedEndpoint {
    pub handler: Arc<dyn RequestHandler>,
    pub metrics: Arc<EndpointMetrics>,
    pub draining: AtomicBool,
    /// The streams in flight, for a drain's deadline to end.
    pub inflight: Arc<InflightStreams>,
}

/// Accept connections on `listener` until `cancel` fires; each one gets its reader and
/// writer tasks.
pub(super) fn spawn_accept_loop(transport: &Arc<Transport>, listener: TcpListener, cancel: CancellationToken) {
    let weak = Arc::downgrade(transport);
    transport.tracker.spawn(async move {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = cancel.cancelled() => return,
            };
            let Some(transport) = weak.upgrade() else { return };
            match accepted {
                Ok((socket, peer)) => {
                    transport.attach(socket, peer.to_string(), false);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
}

impl Transport {
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
    pub(crate) fn on_request(self: &Arc<Self>, conn: &Arc<Link>, stream: u64, header: RequestHeader, body: Bytes) {
        let endpoint = self.endpoints.read().get(&header.endpoint).cloned();
        let Some(endpoint) = endpoint else {
            if self.is_shutting_down() {
                // Drained and removed, but a caller whose discovery has not seen the
                // instance go yet still reaches it: refused as for a draining endpoint,
                // so the caller resends the request elsewhere.
                return self.reject(conn, stream, ErrorKind::Unavailable, &format!("instance {:x} is shutting down", self.instance_id));
            }
            return self.reject(
                conn,
                stream,
                ErrorKind::UnknownEndpoint,
                &format!("endpoint {} is not served by instance {:x}", header.endpoint, self.instance_id),
            );
        };
        if endpoint.draining.load(Ordering::Acquire) {
            return self.reject(conn, stream, ErrorKind::Unavailable, &format!("instance {:x} is shutting down", self.instance_id));
        }
        let context = RequestContext::new(header.id);
        if conn.add_running(stream, context.clone()).is_err() {
            return;
        }
        let entry = endpoint.inflight.add(conn.clone(), stream, context.clone());
        let responder = Responder::new(conn.clone(), stream, context.clone(), endpoint.metrics.clone(), entry);
        endpoint.handler.handle(IncomingRequest { body, context }, responder);
    }

    /// Answer `stream` with an Error frame of `kind` (a refusal, or a malformed request).
    pub(super) fn reject(&self, conn: &Arc<Link>, stream: u64, kind: ErrorKind, message: &str) {
        let h = serde_json::json!({"kind": kind.as_str(), "message": message});
        conn.send_reliably(Frame::with_header(FrameKind::Error, stream, serde_json::to_vec(&h).unwrap_or_default().into(), Bytes::new()));
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use futures::StreamExt;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    use super::*;
    use crate::transport::TransportConfig;

    async fn transport(id: u64, cancel: &CancellationToken) -> Arc<Transport> {
        let config = TransportConfig {
            max_message_size: 1 << 20,
            connect_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(5),
            ping_interval: Duration::from_secs(2),
            peer_timeout: Duration::from_secs(6),
        };
        Transport::bind(config, id, "127.0.0.1", 0, cancel.clone(), TaskTracker::new()).await.unwrap()
    }

    async fn refusal(caller: &Arc<Transport>, worker: &Arc<Transport>, endpoint: &str) -> Error {
        let mut stream = caller.send_tcp(worker.address(), endpoint, "r", Bytes::from_static(b"{}")).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), stream.next()).await.unwrap().unwrap().unwrap_err()
    }

    #[tokio::test]
    async fn an_endpoint_gone_with_its_shutdown_is_refused_as_unavailable_not_unknown() {
        let cancel = CancellationToken::new();
        let (worker, caller) = (transport(1, &cancel).await, transport(2, &cancel).await);
        // Serving: a path it never served is unknown there (the caller's mistake).
        let err = refusal(&caller, &worker, "ns/c/missing").await;
        assert_eq!(err.kind(), ErrorKind::UnknownEndpoint, "{err}");
        // Shutting down, its drained endpoints removed: a caller that still routes to it
        // is told it is going, which it resends elsewhere.
        assert!(!worker.begin_shutdown());
        let err = refusal(&caller, &worker, "ns/c/generate").await;
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.message().contains("shutting down"), "{err}");
        cancel.cancel();
    }
}

//! The accept loop: HTTP/1.1 connections served by hyper with a header read timeout,
//! a cap on open connections (one past it is answered 503 and closed), and graceful
//! shutdown (stop accepting, let open connections finish their responses).

use std::sync::Arc;
use std::time::Duration;

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::error::ApiError;
use super::limits::{HttpLimits, RETRY_AFTER_SECONDS};

/// How long the loop pauses after an accept error that is not about one connection
/// (out of file descriptors), so it does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The 503 a client is answered with when the server is at a limit.
pub(crate) fn overloaded(message: &str) -> Response {
    let mut response = ApiError::unavailable(message).into_response();
    response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECONDS));
    response
}

/// Serve `router` on `listener` until `cancel` fires, then wait for the open
/// connections to finish (the caller bounds that wait by dropping this future, which
/// aborts them).
pub(crate) async fn serve(listener: TcpListener, router: Router, limits: &HttpLimits, cancel: CancellationToken) {
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(limits.header_timeout);
    let mut refuse_builder = builder.clone();
    refuse_builder.keep_alive(false);
    let refuse = Router::new().fallback(|| async {
        let mut response = overloaded("too many connections; retry later");
        response.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
        response
    });

    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            _ = cancel.cancelled() => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) if is_connection_error(&e) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; pausing");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(stream);
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let conn = graceful.watch(builder.serve_connection(io, TowerToHyperService::new(router.clone())));
                connections.spawn(async move {
                    let _ = conn.await;
                    drop(slot);
                });
            }
            Err(_) => {
                tracing::debug!("connection limit reached; answering 503");
                let conn = graceful.watch(refuse_builder.serve_connection(io, TowerToHyperService::new(refuse.clone())));
                connections.spawn(async move {
                    let _ = conn.await;
                });
            }
        }
    }
    drop(listener);
    graceful.shutdown().await;
    while connections.join_next().await.is_some() {}
}

/// Errors of one incoming connection (it went away before it was accepted).
fn is_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionRefused | ConnectionAborted | ConnectionReset)
}

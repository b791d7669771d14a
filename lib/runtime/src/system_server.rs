//! The optional system HTTP server: `/live` (the process runs), `/ready` (it should be
//! sent new requests: endpoints registered, engine answered, not draining; see
//! `readiness.rs`), `/health` (it takes traffic: 503 while shutting down or while a plane
//! it needs is down) and `/metrics` (Prometheus text).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};

use crate::error::{Error, ErrorKind, Result};
use crate::planes::Planes;

/// Bind and serve until the runtime is cancelled; returns the bound address.
pub(crate) async fn start(planes: Planes, host: &str, port: u16) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind((host, port)).await.map_err(|e| {
        Error::with_source(ErrorKind::Config, format!("cannot start the system server on {host}:{port} (DYN_SYSTEM_HOST/DYN_SYSTEM_PORT)"), e)
    })?;
    let addr = listener.local_addr()?;
    let cancel = planes.cancel_token();
    let tracker = planes.tracker();
    let app = Router::new()
        .route("/live", get(live))
        .route("/ready", get(ready))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .with_state(planes);
    tracker.spawn(async move {
        let served = axum::serve(listener, app).with_graceful_shutdown(async move { cancel.cancelled().await }).await;
        if let Err(e) = served {
            tracing::error!(error = %e, "system server failed");
        }
    });
    Ok(addr)
}

async fn live() -> impl IntoResponse {
    Json(serde_json::json!({"status": "live"}))
}

async fn ready(State(rt): State<Planes>) -> impl IntoResponse {
    let endpoints = rt.served_endpoints();
    match rt.readiness() {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"status": "ready", "endpoints": endpoints}))),
        Err(why) => {
            let body = serde_json::json!({"status": why.status(), "reason": why.reason(), "endpoints": endpoints});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body))
        }
    }
}

async fn health(State(rt): State<Planes>) -> impl IntoResponse {
    let endpoints = rt.served_endpoints();
    if rt.is_shutting_down() {
        let body = serde_json::json!({"status": "shutting_down", "endpoints": endpoints});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    match rt.health() {
        Ok(()) => (StatusCode::OK, Json(serde_json::json!({"status": "ready", "endpoints": endpoints}))),
        Err(reason) => {
            let body = serde_json::json!({"status": "unhealthy", "reason": reason, "endpoints": endpoints});
            (StatusCode::SERVICE_UNAVAILABLE, Json(body))
        }
    }
}

async fn metrics(State(rt): State<Planes>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], rt.metrics().render())
}

//! The optional system HTTP server: `/live` (the process runs), `/ready` (it should be
//! sent new requests: endpoints registered, engine answered, not draining; see
//! `readiness.rs`), `/health` (it takes traffic: 503 while shutting down or while a plane
//! it needs is down), `/metrics` (Prometheus text), and the operator's admin API:
//! `POST /drain`, `POST /resume`, `GET /state` (see `drain.rs`).

use std::net::SocketAddr;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
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
        .route("/drain", post(drain))
        .route("/resume", post(resume))
        .route("/state", get(state))
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

/// `POST /drain`: leave routing, keep serving what is in flight; answers the progress.
async fn drain(State(rt): State<Planes>) -> impl IntoResponse {
    admin_answer(rt.drain().await)
}

/// `POST /resume`: back in routing after a drain.
async fn resume(State(rt): State<Planes>) -> impl IntoResponse {
    admin_answer(rt.resume().await)
}

/// `GET /state`: serving, draining or drained, and the count in flight.
async fn state(State(rt): State<Planes>) -> impl IntoResponse {
    admin_answer(Ok(rt.drain_status()))
}

fn admin_answer(result: Result<crate::drain::DrainStatus>) -> (StatusCode, Json<serde_json::Value>) {
    match result {
        Ok(status) => (StatusCode::OK, Json(serde_json::json!(status))),
        Err(e) if e.kind() == ErrorKind::Shutdown => {
            (StatusCode::CONFLICT, Json(serde_json::json!({"state": "shutting_down", "error": e.to_string()})))
        }
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Json(serde_json::json!({"error": e.to_string()}))),
    }
}

//! The optional system HTTP server: `/live` (the process runs), `/ready` (it should be
//! sent new requests: endpoints registered, engine answered, not draining; see
//! `readiness.rs`), `/health` (it takes traffic: 503 while shutting down or while a plane
//! it needs is down), `/metrics` (Prometheus text), and the operator's admin API:
//! `POST /drain`, `POST /resume`, `GET /state` (see `drain.rs`).

use std::net::SocketAddr;
use std::path::Path;

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

/// Write the system server's bound `port` to `path` (`DYN_SYSTEM_PORT_FILE`): to a file
/// beside it, then renamed into place, so a reader never sees a partial number.
pub(crate) fn write_port_file(path: &Path, port: u16) -> Result<()> {
    let fail = |e: std::io::Error| {
        Error::with_source(ErrorKind::Config, format!("cannot write the system port to {} (DYN_SYSTEM_PORT_FILE)", path.display()), e)
    };
    let mut aside = path.as_os_str().to_owned();
    aside.push(format!(".{}.tmp", std::process::id()));
    std::fs::write(&aside, format!("{port}\n")).map_err(fail)?;
    std::fs::rename(&aside, path).map_err(fail)
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

/// `POST /drain`: leave routing, keep serving what is in flight (with `{"deadline_s":
/// N}`, for at most N seconds); answers the progress. A body that is not such an object
/// is a 400.
async fn drain(State(rt): State<Planes>, body: axum::body::Bytes) -> impl IntoResponse {
    match drain_deadline(&body) {
        Ok(deadline) => admin_answer(rt.drain(deadline).await),
        Err(message) => (StatusCode::BAD_REQUEST, Json(serde_json::json!({"error": message}))),
    }
}

/// The deadline of a `POST /drain` body: none when empty or without `deadline_s`.
fn drain_deadline(body: &[u8]) -> std::result::Result<Option<std::time::Duration>, String> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| format!("the body is not JSON: {e}"))?;
    let Some(fields) = value.as_object() else { return Err("the body must be a JSON object".to_string()) };
    match fields.get("deadline_s") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(n) => match n.as_f64() {
            Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(std::time::Duration::from_secs_f64(s))),
            _ => Err(format!("deadline_s must be a number of seconds, 0 or more, got {n}")),
        },
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_body_is_empty_or_names_a_deadline() {
        assert_eq!(drain_deadline(b""), Ok(None));
        assert_eq!(drain_deadline(b" \n"), Ok(None));
        assert_eq!(drain_deadline(b"{}"), Ok(None));
        assert_eq!(drain_deadline(br#"{"deadline_s": null}"#), Ok(None));
        assert_eq!(drain_deadline(br#"{"deadline_s": 2.5}"#), Ok(Some(std::time::Duration::from_millis(2500))));
        assert_eq!(drain_deadline(br#"{"deadline_s": 0}"#), Ok(Some(std::time::Duration::ZERO)));
        for bad in [&br#"{"deadline_s": -1}"#[..], br#"{"deadline_s": "5"}"#, b"[1]", b"{not json"] {
            assert!(drain_deadline(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_port_file_holds_the_port_or_the_error_names_the_variable() {
        let dir = std::env::temp_dir().join(format!("dynamo-port-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("system.port");
        write_port_file(&path, 41234).unwrap();
        write_port_file(&path, 41235).unwrap(); // a restart's port replaces the last one
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "41235\n");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1, "nothing is left beside it");
        let e = write_port_file(&dir.join("missing").join("system.port"), 1).unwrap_err();
        assert!(e.to_string().contains("DYN_SYSTEM_PORT_FILE"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The service's read-only routes: `GET /v1/models`, `/health`, `/live`, `/metrics`.

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;

use super::state::AppState;
use crate::protocols::openai::{ModelList, ModelObject};
use crate::protocols::unix_now;

/// `GET /v1/models`: the models that can be routed now.
pub(crate) async fn list_models(State(state): State<Arc<AppState>>) -> Json<ModelList> {
    let created = unix_now();
    let data = state
        .manager
        .routable_models()
        .into_iter()
        .map(|id| ModelObject { id, object: "model".to_string(), created, owned_by: "dynamo".to_string() })
        .collect();
    Json(ModelList { object: "list".to_string(), data })
}

/// `GET /health`: 200 while at least one model can be routed and the dependencies'
/// check (discovery, planes) passes, else 503 with the reason.
pub(crate) async fn health(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let models = state.manager.routable_models();
    if let Some(Err(reason)) = state.health_check.as_ref().map(|check| check()) {
        let body = serde_json::json!({"status": "unhealthy", "models": models, "message": reason});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    if models.is_empty() {
        let body = serde_json::json!({"status": "unhealthy", "models": models, "message": "no model can be routed"});
        (StatusCode::SERVICE_UNAVAILABLE, Json(body))
    } else {
        (StatusCode::OK, Json(serde_json::json!({"status": "healthy", "models": models})))
    }
}

/// `GET /live`: the process serves HTTP.
pub(crate) async fn live() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "live"}))
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

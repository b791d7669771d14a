//! The service's read-only routes: `GET /v1/models`, `/health`, `/live`, `/ready`,
//! `/metrics`.

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

/// `GET /ready`: 200 while the service listens and can route at least one model; 503
/// before that and from the moment its graceful shutdown begins (a load balancer stops
/// sending it new requests while in-flight responses finish).
pub(crate) async fn ready(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    let models = state.manager.routable_models();
    if state.draining.is_cancelled() {
        let body = serde_json::json!({"status": "draining", "models": models, "message": "the service is shutting down"});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    if models.is_empty() {
        let body = serde_json::json!({"status": "not_ready", "models": models, "message": "no model can be routed"});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(body));
    }
    (StatusCode::OK, Json(serde_json::json!({"status": "ready", "models": models})))
}

/// `GET /metrics`: Prometheus text.
pub(crate) async fn metrics(State(state): State<Arc<AppState>>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], state.metrics.render())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio_util::sync::CancellationToken;

    use crate::admission::Admission;
    use super::super::limits::HttpLimits;
    use super::super::metrics::HttpMetrics;
    use super::*;
    use crate::engines::echo::EchoFull;
    use crate::model_manager::ModelManager;

    fn state(manager: Arc<ModelManager>) -> Arc<AppState> {
        let metrics = Arc::new(HttpMetrics::new().unwrap());
        let admission = Arc::new(Admission::new(Default::default(), metrics.registry()).unwrap());
        Arc::new(AppState {
            manager,
            metrics,
            admission,
            shutdown: CancellationToken::new(),
            draining: CancellationToken::new(),
            body_limit: 1024,
            health_check: None,
            limits: HttpLimits::default(),
            api_key: None,
            responses: crate::http::responses::memory_store(1, std::time::Duration::from_secs(1)),
            background: Default::default(),
            streams: crate::http::streams::StreamRegistry::new(Default::default(), &CancellationToken::new()),
        })
    }

    async fn ready_status(state: &Arc<AppState>) -> (StatusCode, serde_json::Value) {
        let response = ready(State(state.clone())).await.into_response();
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16).await.unwrap();
        (status, serde_json::from_slice(&body).unwrap())
    }

    #[tokio::test]
    async fn ready_needs_a_routable_model_and_ends_with_the_drain() {
        let manager = Arc::new(ModelManager::new());
        let state = state(manager.clone());
        let (status, body) = ready_status(&state).await;
        assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("not_ready")));

        manager.add_full_model("echo", Arc::new(EchoFull::new(Duration::ZERO)));
        let (status, body) = ready_status(&state).await;
        assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("ready")));

        state.draining.cancel();
        let (status, body) = ready_status(&state).await;
        assert_eq!((status, body["status"].as_str()), (StatusCode::SERVICE_UNAVAILABLE, Some("draining")));
        assert_eq!(body["models"], serde_json::json!(["echo"]), "models still listed while draining");
    }
}

//! `HttpService`: the OpenAI-compatible HTTP server. Built with
//! [`HttpService::builder`], bound (port 0 picks a free port), served until a
//! cancellation token fires, then shut down gracefully within a bound.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::http::{header, HeaderName, HeaderValue, Method};
use axum::middleware::from_fn_with_state;
use axum::routing::{get, post};
use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};

use super::error::ApiError;
use super::limits::HttpLimits;
use super::metrics::HttpMetrics;
use super::state::{AppState, HealthCheck};
use super::responses::{self, SharedResponseStore};
use super::streams::{StreamDirectory, StreamRegistry, StreamsConfig};
use super::admission::{self, Admission, GlobalCap};
use super::{connections, health, layers, openai, streams};
use crate::model_manager::ModelManager;

/// Default largest request body: 32 MiB.
pub const DEFAULT_BODY_LIMIT: usize = 32 * 1024 * 1024;
/// Default bound on draining in-flight responses at shutdown.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// After the drain bound, how long streams get to end before the server stops waiting.
const FORCE_STOP_BOUND: Duration = Duration::from_secs(2);

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listening socket could not be opened.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// `host:port` asked for.
        address: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The server failed while running.
    #[error("HTTP server failed: {0}")]
    Serve(std::io::Error),
    /// The metrics registry could not be built.
    #[error("metrics: {0}")]
    Metrics(#[from] prometheus::Error),
    /// An option is invalid.
    #[error("invalid HTTP option: {0}")]
    Config(String),
    /// The server task ended abnormally.
    #[error("HTTP server task failed: {0}")]
    Task(String),
}

/// Configures an [`HttpService`].
#[derive(Clone)]
pub struct HttpServiceBuilder {
    host: String,
    port: u16,
    body_limit: usize,
    drain_timeout: Duration,
    manager: Option<Arc<ModelManager>>,
    health_check: Option<HealthCheck>,
    limits: HttpLimits,
    api_key: Option<String>,
    cors_origins: Vec<String>,
    responses: Option<SharedResponseStore>,
    streams: StreamsConfig,
    stream_directory: Option<Arc<dyn StreamDirectory>>,
    advertise_host: Option<String>,
}

impl std::fmt::Debug for HttpServiceBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpServiceBuilder")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("body_limit", &self.body_limit)
            .field("drain_timeout", &self.drain_timeout)
            .field("health_check", &self.health_check.is_some())
            .field("limits", &self.limits)
            .field("api_key", &self.api_key.is_some())
            .field("cors_origins", &self.cors_origins)
            .field("streams", &self.streams)
            .field("stream_directory", &self.stream_directory.is_some())
            .finish()
    }
}

impl Default for HttpServiceBuilder {
    fn default() -> Self {
        HttpServiceBuilder {
            host: "0.0.0.0".to_string(),
            port: 8080,
            body_limit: DEFAULT_BODY_LIMIT,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            manager: None,
            health_check: None,
            limits: HttpLimits::default(),
            api_key: None,
            cors_origins: Vec::new(),
            responses: None,
            streams: StreamsConfig::default(),
            stream_directory: None,
            advertise_host: None,
        }
    }
}

impl HttpServiceBuilder {
    /// Address to listen on (default `0.0.0.0`).
    pub fn host(mut self, host: impl Into<String>) -> Self {
        self.host = host.into();
        self
    }

    /// Port to listen on (default 8080; 0 picks a free port, see
    /// [`BoundHttpService::local_addr`]).
    pub fn port(mut self, port: u16) -> Self {
        self.port = port;
        self
    }

    /// Largest accepted request body in bytes (default 32 MiB); larger is a 413.
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.body_limit = bytes;
        self
    }

    /// Bound on draining in-flight responses at shutdown (default 10 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// The models to serve (default: a new, empty manager).
    pub fn manager(mut self, manager: Arc<ModelManager>) -> Self {
        self.manager = Some(manager);
        self
    }

    /// Also answer `/health` with 503 while `check` says a dependency is down.
    pub fn health_check(mut self, check: HealthCheck) -> Self {
        self.health_check = Some(check);
        self
    }

    /// Connection and request limits (default: [`HttpLimits::default`]).
    pub fn limits(mut self, limits: HttpLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Require `Authorization: Bearer KEY` on every route but `/health`, `/live`,
    /// `/ready` and `/metrics` (401 otherwise).
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Answer CORS requests from these origins (`https://app.example.com`, or `*` for
    /// any); none by default.
    pub fn cors_origins(mut self, origins: Vec<String>) -> Self {
        self.cors_origins = origins;
        self
    }

    /// Where `/v1/responses` keeps responses (default: in memory,
    /// [`responses::DEFAULT_RESPONSES_MAX`] for [`responses::DEFAULT_RESPONSES_TTL`]).
    pub fn responses_store(mut self, store: SharedResponseStore) -> Self {
        self.responses = Some(store);
        self
    }

    /// Bounds of resumable streams: buffer bytes, grace period, retention.
    pub fn streams(mut self, config: StreamsConfig) -> Self {
        self.streams = config;
        self
    }

    /// Announce resumable streams in `directory`, and forward resumes of streams other
    /// frontends own to them (see [`StreamDirectory`]).
    pub fn stream_directory(mut self, directory: Arc<dyn StreamDirectory>) -> Self {
        self.stream_directory = Some(directory);
        self
    }

    /// The host other frontends reach this one at (default: the listening host, or
    /// 127.0.0.1 when that is unspecified, `0.0.0.0` or `::`).
    pub fn advertise_host(mut self, host: impl Into<String>) -> Self {
        self.advertise_host = Some(host.into());
        self
    }

    /// Build the service; fails on a CORS origin that is not a valid header value.
    pub fn build(self) -> Result<HttpService, HttpError> {
        let cors = cors_layer(&self.cors_origins)?;
        let manager = self.manager.unwrap_or_default();
        let metrics = Arc::new(HttpMetrics::new()?);
        for collector in manager.collectors() {
            metrics.registry().register(collector)?;
        }
        let shutdown = CancellationToken::new();
        let streams = StreamRegistry::with_directory(self.streams, &shutdown, self.stream_directory);
        let advertise_host = self.advertise_host.unwrap_or_else(|| match self.host.as_str() {
            "0.0.0.0" | "::" | "[::]" => "127.0.0.1".to_string(),
            host => host.to_string(),
        });
        let admission = Arc::new(Admission::new(self.limits.admission.clone(), metrics.registry())?);
        let state = Arc::new(AppState {
            manager,
            metrics,
            shutdown,
            draining: CancellationToken::new(),
            body_limit: self.body_limit,
            health_check: self.health_check,
            limits: self.limits.clone(),
            api_key: self.api_key,
            responses: self.responses.unwrap_or_else(|| {
                responses::memory_store(responses::DEFAULT_RESPONSES_MAX, responses::DEFAULT_RESPONSES_TTL)
            }),
            background: Default::default(),
            streams,
            admission: admission.clone(),
        });
        let inflight = GlobalCap { slots: Arc::new(Semaphore::new(self.limits.max_inflight)), admission };
        Ok(HttpService {
            host: self.host,
            port: self.port,
            body_limit: self.body_limit,
            drain_timeout: self.drain_timeout,
            advertise_host,
            state,
            inflight,
            cors,
        })
    }
}

/// The CORS layer for `origins` (`*`: any), or none without origins.
fn cors_layer(origins: &[String]) -> Result<Option<CorsLayer>, HttpError> {
    if origins.is_empty() {
        return Ok(None);
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        let values = origins
            .iter()
            .map(|o| HeaderValue::from_str(o).map_err(|_| HttpError::Config(format!("invalid CORS origin {o:?}"))))
            .collect::<Result<Vec<_>, _>>()?;
        AllowOrigin::list(values)
    };
    let request_id = HeaderName::from_static("x-request-id");
    Ok(Some(
        CorsLayer::new()
            .allow_origin(allow)
            .allow_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
            .allow_headers([
                header::AUTHORIZATION,
                header::CONTENT_TYPE,
                request_id.clone(),
                streams::RESUMABLE_HEADER,
                HeaderName::from_static("last-event-id"),
            ])
            .expose_headers([request_id]),
    ))
}

/// The OpenAI-compatible HTTP service.
pub struct HttpService {
    host: String,
    port: u16,
    body_limit: usize,
    drain_timeout: Duration,
    advertise_host: String,
    state: Arc<AppState>,
    /// The global cap on generation requests in flight.
    inflight: GlobalCap,
    cors: Option<CorsLayer>,
}

impl std::fmt::Debug for HttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpService").field("host", &self.host).field("port", &self.port).finish()
    }
}

impl HttpService {
    /// A builder with the defaults.
    pub fn builder() -> HttpServiceBuilder {
        HttpServiceBuilder::default()
    }

    /// The models this service serves.
    pub fn manager(&self) -> &Arc<ModelManager> {
        &self.state.manager
    }

    /// The service's metrics (its registry can take more families).
    pub fn metrics(&self) -> &Arc<HttpMetrics> {
        &self.state.metrics
    }

    /// The routes, for embedding in another axum server: the API key, CORS, request
    /// ids, body bounds and the in-flight cap come with them; the connection cap and
    /// the header timeout belong to [`HttpService::bind`]'s server.
    pub fn router(&self) -> Router {
        let generation = Router::new()
            .route("/v1/chat/completions", post(openai::chat_completions))
            .route("/v1/completions", post(openai::completions))
            .route("/v1/embeddings", post(openai::embeddings))
            // The Responses API (docs/responses.md).
            .route("/v1/responses", post(responses::handlers::create))
            .route_layer(from_fn_with_state(self.inflight.clone(), admission::limit_inflight));
        let router = Router::new()
            .route("/v1/models", get(health::list_models))
            .route("/health", get(health::health))
            .route("/live", get(health::live))
            .route("/ready", get(health::ready))
            .route("/metrics", get(health::metrics))
            .route("/v1/responses/{id}", get(responses::handlers::retrieve).delete(responses::handlers::delete))
            .route("/v1/responses/{id}/cancel", post(responses::handlers::cancel))
            .route("/v1/responses/{id}/input_items", get(responses::handlers::list_input_items))
            .route("/v1/streams/{request_id}", get(streams::resume_stream).delete(streams::cancel_stream))
            .route("/v1/streams/{request_id}/cancel", post(streams::cancel_stream))
            .merge(generation)
            .fallback(|| async { ApiError::new(axum::http::StatusCode::NOT_FOUND, "no such route", "not_found_error", None) })
            .layer(DefaultBodyLimit::max(self.body_limit))
            .layer(from_fn_with_state(self.state.clone(), layers::require_api_key))
            .layer(from_fn_with_state(self.state.clone(), layers::observe));
        let router = match &self.cors {
            Some(cors) => router.layer(cors.clone()),
            None => router,
        };
        router.with_state(self.state.clone())
    }

    /// Open the listening socket.
    pub async fn bind(&self) -> Result<BoundHttpService, HttpError> {
        let address = format!("{}:{}", self.host, self.port);
        let listener = TcpListener::bind((self.host.as_str(), self.port))
            .await
            .map_err(|source| HttpError::Bind { address: address.clone(), source })?;
        let local_addr = listener.local_addr().map_err(|source| HttpError::Bind { address, source })?;
        self.state.streams.set_address(format!("{}:{}", self.advertise_host, local_addr.port()));
        Ok(BoundHttpService {
            listener,
            local_addr,
            router: self.router(),
            drain_timeout: self.drain_timeout,
            shutdown: self.state.shutdown.clone(),
            draining: self.state.draining.clone(),
            limits: self.state.limits.clone(),
            api_key: self.state.api_key.is_some(),
            streams: self.state.streams.clone(),
        })
    }

    /// The resumable streams this service owns.
    pub fn streams(&self) -> &StreamRegistry {
        &self.state.streams
    }

    /// Bind and serve until `cancel` fires, then shut down gracefully.
    pub async fn run(&self, cancel: CancellationToken) -> Result<(), HttpError> {
        self.bind().await?.serve(cancel).await
    }

    /// Bind, then serve on a task owned by the returned handle.
    pub async fn spawn(&self, cancel: CancellationToken) -> Result<RunningHttpService, HttpError> {
        let bound = self.bind().await?;
        let local_addr = bound.local_addr();
        let task = tokio::spawn(bound.serve(cancel.clone()));
        Ok(RunningHttpService { local_addr, cancel, force: self.state.shutdown.clone(), task: Some(task) })
    }
}

/// A service whose socket is open; [`BoundHttpService::serve`] takes connections.
pub struct BoundHttpService {
    listener: TcpListener,
    local_addr: SocketAddr,
    router: Router,
    drain_timeout: Duration,
    shutdown: CancellationToken,
    draining: CancellationToken,
    limits: HttpLimits,
    api_key: bool,
    streams: StreamRegistry,
}

impl std::fmt::Debug for BoundHttpService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BoundHttpService").field("local_addr", &self.local_addr).finish()
    }
}

impl BoundHttpService {
    /// The address the socket is bound to (the real port when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Serve until `cancel` fires; then answer `/ready` with 503, stop accepting, let
    /// in-flight responses finish within the drain bound, end the rest with an error,
    /// and return.
    pub async fn serve(self, cancel: CancellationToken) -> Result<(), HttpError> {
        let streams = self.streams.clone();
        let result = self.serve_connections(cancel).await;
        // Detached streams outlive their connections; the server's end is theirs.
        if tokio::time::timeout(FORCE_STOP_BOUND, streams.shutdown()).await.is_err() {
            tracing::warn!("some resumable streams outlived the shutdown bound");
        }
        result
    }

    async fn serve_connections(self, cancel: CancellationToken) -> Result<(), HttpError> {
        let limits = &self.limits;
        tracing::info!(
            address = %self.local_addr,
            max_connections = limits.max_connections,
            max_inflight = limits.max_inflight,
            header_timeout_s = limits.header_timeout.as_secs_f64(),
            body_timeout_s = limits.body_timeout.as_secs_f64(),
            api_key = self.api_key,
            "HTTP service listening"
        );
        let server = connections::serve(self.listener, self.router, &self.limits, cancel.clone());
        tokio::pin!(server);
        tokio::select! {
            () = &mut server => return Ok(()),
            _ = cancel.cancelled() => {}
        }
        self.draining.cancel();
        tracing::info!(timeout = ?self.drain_timeout, "draining: /ready answers 503; waiting for in-flight responses");
        if tokio::time::timeout(self.drain_timeout, &mut server).await.is_ok() {
            return Ok(());
        }
        tracing::warn!(timeout = ?self.drain_timeout, "drain bound reached; ending in-flight responses");
        self.shutdown.cancel();
        if tokio::time::timeout(FORCE_STOP_BOUND, &mut server).await.is_err() {
            tracing::warn!("some HTTP connections outlived the shutdown bound");
        }
        Ok(())
    }
}

/// A service serving on its own task; dropping the handle stops it at once (in-flight
/// responses end with an error), [`RunningHttpService::shutdown`] gracefully.
#[derive(Debug)]
pub struct RunningHttpService {
    local_addr: SocketAddr,
    cancel: CancellationToken,
    force: CancellationToken,
    task: Option<JoinHandle<Result<(), HttpError>>>,
}

impl RunningHttpService {
    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Shut down gracefully and wait for the server to stop.
    pub async fn shutdown(mut self) -> Result<(), HttpError> {
        self.cancel.cancel();
        match self.task.take() {
            Some(task) => task.await.map_err(|e| HttpError::Task(e.to_string()))?,
            None => Ok(()),
        }
    }
}

impl Drop for RunningHttpService {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.cancel.cancel();
            self.force.cancel();
            task.abort();
        }
    }
}

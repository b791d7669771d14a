//! The models a frontend can serve: model name → chat engine and/or completions
//! engine. The HTTP service reads it on every request; the model watcher (and
//! `dynamo-run` for static engines) writes it.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;
use prometheus::core::Collector;
use prometheus::{IntCounterVec, IntGauge, IntGaugeVec, Opts};

use crate::engine::{EngineError, OpenAIEngine};

/// Whether an engine can take a request now (a remote engine: its endpoint has at
/// least one instance). Engines added without one are always routable.
pub type ReadyCheck = Arc<dyn Fn() -> bool + Send + Sync>;

/// Which OpenAI route an engine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
}

impl EngineKind {
    /// The route's name in messages and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Chat => "chat_completions",
            EngineKind::Completions => "completions",
        }
    }
}

#[derive(Clone)]
struct Slot {
    engine: Arc<dyn OpenAIEngine>,
    ready: Option<ReadyCheck>,
}

impl Slot {
    fn is_ready(&self) -> bool {
        self.ready.as_ref().is_none_or(|check| check())
    }
}

#[derive(Clone, Default)]
struct Model {
    chat: Option<Slot>,
    completions: Option<Slot>,
}

impl Model {
    fn slot(&self, kind: EngineKind) -> Option<&Slot> {
        match kind {
            EngineKind::Chat => self.chat.as_ref(),
            EngineKind::Completions => self.completions.as_ref(),
        }
    }

    fn slot_mut(&mut self, kind: EngineKind) -> &mut Option<Slot> {
        match kind {
            EngineKind::Chat => &mut self.chat,
            EngineKind::Completions => &mut self.completions,
        }
    }

    fn is_routable(&self) -> bool {
        self.chat.iter().chain(self.completions.iter()).any(Slot::is_ready)
    }
}

/// Requests waiting at the frontend, by model: demand the workers' own queues do not show
/// (`frontend::scale_to_zero` and the busy hold of `remote` count, the HTTP service exports).
#[derive(Clone)]
pub struct WaitMetrics {
    /// Requests that found no worker registered (served after a wait, or refused).
    pub arrivals: IntCounterVec,
    /// Requests waiting for a worker now.
    pub waiting: IntGaugeVec,
    /// Requests held now because every worker is over the router's busy threshold
    /// (`--busy-wait-s`): demand the workers' own queues do not show.
    pub held_busy: IntGaugeVec,
}

impl Default for WaitMetrics {
    fn default() -> Self {
        let arrivals = IntCounterVec::new(
            Opts::new(
                "dynamo_frontend_requests_without_workers_total",
                "Requests that found their model with no worker (--keep-models): demand at zero",
            ),
            &["model"],
        )
        .expect("a valid metric definition");
        let waiting = IntGaugeVec::new(
            Opts::new("dynamo_frontend_requests_waiting_for_workers", "Requests waiting for a worker of their model now"),
            &["model"],
        )
        .expect("a valid metric definition");
        let held_busy = IntGaugeVec::new(
            Opts::new(
                "dynamo_frontend_requests_waiting_for_capacity",
                "Requests held at the frontend while every worker of their model is busy (--busy-wait-s)",
            ),
            &["model"],
        )
        .expect("a valid metric definition");
        WaitMetrics { arrivals, waiting, held_busy }
    }
}

/// One request counted in a gauge of [`WaitMetrics`] while it lives (also when its future
/// is dropped).
pub(crate) struct Waiting(IntGauge);

impl Waiting {
    pub(crate) fn new(gauge: IntGauge) -> Self {
        gauge.inc();
        Waiting(gauge)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// Thread-safe map of model name → engines. Cheap to share behind an `Arc`.
pub struct ModelManager {
    models: RwLock<BTreeMap<String, Model>>,
    /// Streams continued on another worker, by model (the HTTP service exports it).
    migrations: IntCounterVec,
    /// Requests waiting at the frontend: at zero workers (`--keep-models`), or while
    /// every worker is busy (`--busy-wait-s`).
    waits: WaitMetrics,
    /// Bumped each time an engine is added, for whoever waits for one.
    added: tokio::sync::watch::Sender<u64>,
}

impl Default for ModelManager {
    fn default() -> Self {
        let opts = Opts::new(
            "dynamo_frontend_migrations_total",
            "Requests continued on another worker after theirs failed mid-stream",
        );
        let migrations = IntCounterVec::new(opts, &["model"]).expect("a valid metric definition");
        ModelManager {
            models: RwLock::new(BTreeMap::new()),
            migrations,
            waits: WaitMetrics::default(),
            added: tokio::sync::watch::Sender::new(0),
        }
    }
}

impl std::fmt::Debug for ModelManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelManager").field("models", &self.model_names()).finish()
    }
}

impl ModelManager {
    /// An empty manager.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serve `name` on the route of `kind` with `engine`, replacing any engine there.
    /// `ready` says whether the engine can take requests now (`None`: always).
    pub fn add_engine(&self, name: &str, kind: EngineKind, engine: Arc<dyn OpenAIEngine>, ready: Option<ReadyCheck>) {
        let mut models = self.models.write();
        *models.entry(name.to_string()).or_default().slot_mut(kind) = Some(Slot { engine, ready });
        drop(models);
        self.added.send_modify(|n| *n += 1);
        tracing::info!(model = name, route = kind.as_str(), "model added");
    }

    /// Changes each time an engine is added (or replaced): a request waiting for a
    /// model's engine to be built waits on it.
    pub fn engine_added(&self) -> tokio::sync::watch::Receiver<u64> {
        self.added.subscribe()
    }

    /// Serve `name` for chat with an engine that is always ready (a static engine).
    pub fn add_chat_model(&self, name: &str, engine: Arc<dyn OpenAIEngine>) {
        self.add_engine(name, EngineKind::Chat, engine, None);
    }

    /// Serve `name` for completions with an engine that is always ready.
    pub fn add_completions_model(&self, name: &str, engine: Arc<dyn OpenAIEngine>) {
        self.add_engine(name, EngineKind::Completions, engine, None);
    }

    /// Serve `name` for both chat and completions with one always-ready engine (what
    /// `dynamo-run in=http out=echo_full` does).
    pub fn add_full_model(&self, name: &str, engine: Arc<dyn OpenAIEngine>) {
        self.add_chat_model(name, engine.clone());
        self.add_completions_model(name, engine);
    }

    /// Stop serving `name` on the route of `kind`; the model goes when it has no route
    /// left. Returns whether an engine was removed.
    pub fn remove_engine(&self, name: &str, kind: EngineKind) -> bool {
        let mut models = self.models.write();
        let Some(model) = models.get_mut(name) else { return false };
        let removed = model.slot_mut(kind).take().is_some();
        if model.chat.is_none() && model.completions.is_none() {
            models.remove(name);
        }
        removed
    }

    /// Stop serving `name` entirely. Returns whether it was known.
    pub fn remove_model(&self, name: &str) -> bool {
        let removed = self.models.write().remove(name).is_some();
        if removed {
            tracing::info!(model = name, "model removed");
        }
        removed
    }

    /// Whether `name` has an engine for `kind` (ready or not).
    pub fn has_engine(&self, name: &str, kind: EngineKind) -> bool {
        self.models.read().get(name).is_some_and(|m| m.slot(kind).is_some())
    }

    /// Whether `name` is known (ready or not).
    pub fn has_model(&self, name: &str) -> bool {
        self.models.read().contains_key(name)
    }

    /// The engine serving `name` on the route of `kind`; `NotFound` when there is none.
    pub fn engine(&self, name: &str, kind: EngineKind) -> Result<Arc<dyn OpenAIEngine>, EngineError> {
        let models = self.models.read();
        let model = models.get(name).ok_or_else(|| EngineError::NotFound(format!("model '{name}' does not exist")))?;
        model
            .slot(kind)
            .map(|s| s.engine.clone())
            .ok_or_else(|| EngineError::NotFound(format!("model '{name}' does not serve {}", kind.as_str())))
    }

    /// The chat engine of `name`.
    pub fn chat_engine(&self, name: &str) -> Result<Arc<dyn OpenAIEngine>, EngineError> {
        self.engine(name, EngineKind::Chat)
    }

    /// The completions engine of `name`.
    pub fn completions_engine(&self, name: &str) -> Result<Arc<dyn OpenAIEngine>, EngineError> {
        self.engine(name, EngineKind::Completions)
    }

    /// The per-model counter of migrated streams (`dynamo_frontend_migrations_total`).
    pub fn migrations(&self) -> &IntCounterVec {
        &self.migrations
    }

    /// The requests counted waiting at the frontend (`--keep-models`, `--busy-wait-s`).
    pub fn waits(&self) -> &WaitMetrics {
        &self.waits
    }

    /// The metrics the manager's engines keep, for the HTTP service to export.
    pub fn collectors(&self) -> Vec<Box<dyn Collector>> {
        vec![
            Box::new(self.migrations.clone()),
            Box::new(self.waits.arrivals.clone()),
            Box::new(self.waits.waiting.clone()),
            Box::new(self.waits.held_busy.clone()),
        ]
    }

    /// Every known model, sorted, whether it can be routed now or not.
    pub fn model_names(&self) -> Vec<String> {
        self.models.read().keys().cloned().collect()
    }

    /// Whether `name` can take a request now (one of its engines is ready).
    pub fn is_routable(&self, name: &str) -> bool {
        // Clone the model out so that no readiness check runs under the lock.
        let model = self.models.read().get(name).cloned();
        model.is_some_and(|m| m.is_routable())
    }

    /// The models that can take a request now, sorted (what `/v1/models` lists and
    /// `/health` counts).
    pub fn routable_models(&self) -> Vec<String> {
        // Clone the slots out so that no readiness check runs under the lock.
        let models: Vec<(String, Model)> = self.models.read().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        models.into_iter().filter(|(_, m)| m.is_routable()).map(|(name, _)| name).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    use async_trait::async_trait;

    use crate::engine::{ChatStream, CompletionStream, RequestContext};
    use crate::protocols::openai::{ChatCompletionRequest, CompletionRequest};

    struct Nothing;

    #[async_trait]
    impl OpenAIEngine for Nothing {
        async fn chat(&self, _: ChatCompletionRequest, _: RequestContext) -> Result<ChatStream, EngineError> {
            Err(EngineError::Internal("unused".into()))
        }
        async fn completion(&self, _: CompletionRequest, _: RequestContext) -> Result<CompletionStream, EngineError> {
            Err(EngineError::Internal("unused".into()))
        }
    }

    #[test]
    fn add_get_remove() {
        let m = ModelManager::new();
        m.add_chat_model("a", Arc::new(Nothing));
        m.add_full_model("b", Arc::new(Nothing));
        assert!(m.chat_engine("a").is_ok());
        assert!(matches!(m.completions_engine("a"), Err(EngineError::NotFound(msg)) if msg.contains("completions")));
        assert!(matches!(m.chat_engine("zz"), Err(EngineError::NotFound(_))));
        assert_eq!(m.model_names(), vec!["a", "b"]);
        assert!(m.remove_engine("b", EngineKind::Chat));
        assert!(m.has_model("b") && !m.has_engine("b", EngineKind::Chat));
        assert!(m.remove_engine("b", EngineKind::Completions));
        assert!(!m.has_model("b"));
        assert!(m.remove_model("a"));
        assert!(!m.remove_model("a"));
        assert!(m.model_names().is_empty());
    }

    #[test]
    fn routable_follows_the_ready_check() {
        let m = ModelManager::new();
        let up = Arc::new(AtomicBool::new(false));
        let check = up.clone();
        m.add_engine("remote", EngineKind::Chat, Arc::new(Nothing), Some(Arc::new(move || check.load(Ordering::SeqCst))));
        m.add_chat_model("static", Arc::new(Nothing));
        assert_eq!(m.routable_models(), vec!["static"]);
        up.store(true, Ordering::SeqCst);
        assert_eq!(m.routable_models(), vec!["remote", "static"]);
    }

    #[test]
    fn the_metrics_are_named_for_the_planner() {
        let m = WaitMetrics::default();
        m.arrivals.with_label_values(&["m"]).inc();
        m.waiting.with_label_values(&["m"]).inc();
        m.held_busy.with_label_values(&["m"]).inc();
        let names: Vec<String> = [&m.arrivals as &dyn prometheus::core::Collector, &m.waiting, &m.held_busy]
            .iter()
            .flat_map(|c| c.collect())
            .map(|f| f.name().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "dynamo_frontend_requests_without_workers_total",
                "dynamo_frontend_requests_waiting_for_workers",
                "dynamo_frontend_requests_waiting_for_capacity"
            ]
        );
    }
}

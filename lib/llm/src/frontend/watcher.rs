//! `ModelWatcher`: follows the model entries in discovery and keeps a
//! [`ModelManager`] in step: the first entry of a model builds its engines, the last
//! one to go removes them — unless models are kept (`--keep-models`, see
//! `scale_to_zero`): then a model stays listed with zero workers, and models recorded as
//! kept are listed from the start (`kept`). A bad entry (malformed JSON, unreachable card, a factory
//! that refuses) is logged and skipped; it never stops the watcher.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use dynamo_runtime::discovery::{KeyValue, WatchEvent};
use dynamo_runtime::{Client, DistributedRuntime, EndpointId};

use crate::discovery::{fetch_card, ModelDiscoveryError, ModelEntry, MODELS_PREFIX};
use crate::remote::{MigrationPolicy, RemoteOpenAIEngine, RemoteTokenEngine, DEFAULT_MIGRATION_LIMIT, DEFAULT_RESEND_LIMIT};
use crate::routing::RouterMode;
use crate::engine::{EngineFactory, OpenAIEngine, TokenEngine};
use crate::kv_router::{KvRouter, KvRouterConfig};
use crate::model_card::ModelKind;
use crate::model_manager::{EngineKind, ModelManager, ReadyCheck};

use super::kept::{self, ColdEngine};
use super::scale_to_zero::ZeroWaitEngine;

/// Default bound on fetching a model card.
pub const DEFAULT_CARD_TIMEOUT: Duration = Duration::from_secs(10);

/// Watches `v1/models/` and registers the models it finds in a [`ModelManager`].
pub struct ModelWatcher {
    runtime: DistributedRuntime,
    manager: Arc<ModelManager>,
    router_mode: RouterMode,
    factory: EngineFactory,
    card_timeout: Duration,
    migration_limit: u32,
    resend_limit: u32,
    /// Only the models registered on this endpoint, when set.
    endpoint: Option<EndpointId>,
    /// Only the models registered in this namespace, when set.
    namespace: Option<String>,
    kv_config: KvRouterConfig,
    /// Keep a model listed at zero workers; its requests wait this long for one.
    zero_wait: Option<Duration>,
    entries: HashMap<String, ModelEntry>,
    /// The endpoint each route of each model was built from.
    built: HashMap<(String, EngineKind), EndpointId>,
    /// Kept models listed from their record, waiting for a first worker (`kept`).
    cold: HashSet<String>,
    /// Kept models this frontend has recorded in discovery.
    recorded: HashSet<String>,
}

impl std::fmt::Debug for ModelWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelWatcher").field("router_mode", &self.router_mode).field("entries", &self.entries.len()).finish()
    }
}

/// The routes a model of `kind` is served on. A `chat` model is an OpenAI engine, which
/// takes completions too (`echo_full` behind `dynamo-run in=dyn://…` serves both); only a
/// `completions` model is limited to its route.
fn routes(kind: ModelKind) -> &'static [EngineKind] {
    match kind {
        ModelKind::Chat | ModelKind::Backend => &[EngineKind::Chat, EngineKind::Completions],
        ModelKind::Completions => &[EngineKind::Completions],
    }
}

/// Routable while at least one instance is registered and not marked down (found
/// dead, frozen or cut off).
fn has_instances(client: &Client) -> ReadyCheck {
    let client = client.clone();
    Arc::new(move || !client.routable_instance_ids().is_empty())
}

impl ModelWatcher {
    /// A watcher registering into `manager`, routing with `router_mode`, building
    /// `backend` models with `factory`. With [`RouterMode::Kv`], each `backend` model
    /// gets its own [`KvRouter`] (block size from its entry, default 16); `chat` and
    /// `completions` models have no token ids at the frontend and go round-robin.
    pub fn new(runtime: DistributedRuntime, manager: Arc<ModelManager>, router_mode: RouterMode, factory: EngineFactory) -> Self {
        ModelWatcher {
            runtime,
            manager,
            router_mode,
            factory,
            card_timeout: DEFAULT_CARD_TIMEOUT,
            migration_limit: DEFAULT_MIGRATION_LIMIT,
            resend_limit: DEFAULT_RESEND_LIMIT,
            endpoint: None,
            namespace: None,
            kv_config: KvRouterConfig::default(),
            zero_wait: None,
            entries: HashMap::new(),
            built: HashMap::new(),
            cold: HashSet::new(),
            recorded: HashSet::new(),
        }
    }

    /// Bound on fetching a model card (default 10 s).
    pub fn with_card_timeout(mut self, timeout: Duration) -> Self {
        self.card_timeout = timeout;
        self
    }

    /// Times a broken stream of a `backend` model is continued on another worker when
    /// the model's entry does not say (default [`DEFAULT_MIGRATION_LIMIT`], 3; 0: never).
    pub fn with_migration_limit(mut self, limit: u32) -> Self {
        self.migration_limit = limit;
        self
    }

    /// Times a request no worker started (unreachable, refused, not taken in time, lost
    /// before its first item) is sent to another instance, for every model (default
    /// [`DEFAULT_RESEND_LIMIT`]).
    pub fn with_resend_limit(mut self, limit: u32) -> Self {
        self.resend_limit = limit;
        self
    }

    /// Serve only the models registered on `endpoint` (`dynamo-run out=dyn://ns.comp.ep`);
    /// entries of other endpoints are ignored.
    pub fn with_endpoint(mut self, endpoint: EndpointId) -> Self {
        self.endpoint = Some(endpoint);
        self
    }

    /// Serve only the models registered in `namespace` (a frontend per namespace).
    pub fn with_namespace(mut self, namespace: String) -> Self {
        self.namespace = Some(namespace);
        self
    }

    /// Settings of the KV routers of [`RouterMode::Kv`] (the block size comes from each
    /// model's entry).
    pub fn with_kv_config(mut self, config: KvRouterConfig) -> Self {
        self.kv_config = config;
        self
    }

    /// Keep each model listed after its last worker leaves (scale to zero): a request
    /// for it then waits up to `wait` for a worker to register, and is refused with 503
    /// (`NoWorkerError`) after that. Counted in the manager's `waits` metrics.
    pub fn with_keep_models(mut self, wait: Duration) -> Self {
        self.zero_wait = Some(wait);
        self
    }

    /// Load the models registered now, then follow changes on a task owned by the
    /// returned handle, until `cancel` fires or the runtime shuts down.
    pub async fn start(mut self, cancel: CancellationToken) -> Result<ModelWatcherHandle, ModelDiscoveryError> {
        let mut watch = self.runtime.discovery().watch_prefix(MODELS_PREFIX).await?;
        for kv in std::mem::take(&mut watch.initial) {
            self.put(kv).await;
        }
        if let Some(wait) = self.zero_wait {
            self.list_kept(wait).await;
        }
        let task_cancel = cancel.clone();
        let task = tokio::spawn(async move {
            let runtime_cancel = self.runtime.cancel_token();
            loop {
                let event = tokio::select! {
                    e = watch.events.recv() => e,
                    _ = task_cancel.cancelled() => return,
                    _ = runtime_cancel.cancelled() => return,
                };
                // A slow card fetch must not hold up shutdown.
                let handled = async {
                    match event {
                        Some(WatchEvent::Put(kv)) => self.put(kv).await,
                        Some(WatchEvent::Delete(key)) => self.delete(&key).await,
                        None => return false,
                    }
                    true
                };
                let keep_going = tokio::select! {
                    k = handled => k,
                    _ = task_cancel.cancelled() => return,
                };
                if !keep_going {
                    if !self.runtime.is_shutting_down() {
                        tracing::error!("the model watch ended; the model list is frozen");
                    }
                    return;
                }
            }
        });
        Ok(ModelWatcherHandle { cancel, task: Some(task) })
    }

    async fn put(&mut self, kv: KeyValue) {
        let entry = match serde_json::from_slice::<ModelEntry>(&kv.value) {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(key = kv.key, error = %e, "ignoring a malformed model entry");
                self.delete(&kv.key).await;
                return;
            }
        };
        if !self.wanted(&entry) {
            return;
        }
        if let Some(old) = self.entries.get(&kv.key) {
            if *old == entry {
                return;
            }
            // The entry changed (another name, kind or endpoint): forget the old one first.
            self.delete(&kv.key).await;
        }
        self.entries.insert(kv.key, entry.clone());
        self.build(&entry).await;
    }

    /// List each recorded kept model that no worker registers now, with a [`ColdEngine`]
    /// per route (a cold frontend at zero workers). A discovery error is logged: the
    /// models then appear when their workers register, as without records.
    async fn list_kept(&mut self, wait: Duration) {
        let records = match kept::recorded(self.runtime.discovery().as_ref()).await {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the kept models; they are listed once a worker registers them");
                return;
            }
        };
        for entry in records {
            if self.manager.has_model(&entry.name) || !self.wanted(&entry) {
                continue;
            }
            for &route in routes(entry.kind) {
                let engine = ColdEngine::new(&self.manager, &entry.name, route, wait);
                self.manager.add_engine(&entry.name, route, Arc::new(engine), Some(Arc::new(|| true)));
            }
            tracing::info!(model = entry.name, "kept model listed from its record; waiting for a worker (--keep-models)");
            self.recorded.insert(entry.name.clone());
            self.cold.insert(entry.name);
        }
    }

    /// Whether this watcher serves `entry` (its endpoint and namespace filters).
    fn wanted(&self, entry: &ModelEntry) -> bool {
        let other_endpoint = self.endpoint.as_ref().is_some_and(|wanted| *wanted != entry.endpoint);
        let other_namespace = self.namespace.as_ref().is_some_and(|wanted| *wanted != entry.endpoint.namespace);
        !other_endpoint && !other_namespace
    }

    /// Record a kept model in discovery once (`kept`); a failure is logged: the model
    /// is still kept here, only a frontend started later would not list it.
    async fn record_kept(&mut self, entry: &ModelEntry) {
        if self.zero_wait.is_none() || self.recorded.contains(&entry.name) {
            return;
        }
        match kept::record(self.runtime.discovery().as_ref(), entry).await {
            Ok(()) => {
                self.recorded.insert(entry.name.clone());
            }
            Err(e) => tracing::warn!(model = entry.name, error = %e, "cannot record the kept model in discovery"),
        }
    }

    /// Build the routes of `entry`'s model that nobody serves yet (or that a kept model
    /// serves from an endpoint with no entry left, when `entry` names another one).
    async fn build(&mut self, entry: &ModelEntry) {
        let kept_elsewhere = |built: Option<&EndpointId>| {
            built.is_some_and(|ep| *ep != entry.endpoint && !self.entries.values().any(|e| e.name == entry.name && e.endpoint == *ep))
        };
        let cold = self.cold.contains(&entry.name);
        let missing: Vec<EngineKind> = routes(entry.kind)
            .iter()
            .copied()
            .filter(|r| {
                let built = self.built.get(&(entry.name.clone(), *r));
                (built.is_none() && (cold || !self.manager.has_engine(&entry.name, *r))) || kept_elsewhere(built)
            })
            .collect();
        if missing.is_empty() {
            return;
        }
        match self.engine_for(entry).await {
            Ok((engine, ready)) => {
                for route in missing {
                    self.manager.add_engine(&entry.name, route, engine.clone(), Some(ready.clone()));
                    self.built.insert((entry.name.clone(), route), entry.endpoint.clone());
                }
                self.cold.remove(&entry.name);
                self.record_kept(entry).await;
            }
            Err(e) => tracing::warn!(model = entry.name, endpoint = %entry.endpoint, error = %e, "cannot serve this model entry; skipping it"),
        }
    }

    async fn engine_for(&self, entry: &ModelEntry) -> Result<(Arc<dyn OpenAIEngine>, ReadyCheck), ModelDiscoveryError> {
        let id = &entry.endpoint;
        let endpoint = self.runtime.namespace(id.namespace.clone())?.component(id.component.clone())?.endpoint(id.name.clone())?;
        let client = endpoint.client().await?;
        let (engine, ready) = self.remote_engine(entry, &endpoint, client.clone()).await?;
        match self.zero_wait {
            // Listed whether or not a worker is there: the wait covers the gap.
            Some(wait) => {
                let kept = ZeroWaitEngine::new(engine, client, &entry.name, wait, self.manager.waits().clone());
                Ok((Arc::new(kept), Arc::new(|| true)))
            }
            None => Ok((engine, ready)),
        }
    }

    async fn remote_engine(
        &self,
        entry: &ModelEntry,
        endpoint: &dynamo_runtime::Endpoint,
        client: Client,
    ) -> Result<(Arc<dyn OpenAIEngine>, ReadyCheck), ModelDiscoveryError> {
        let ready = has_instances(&client);
        match entry.kind {
            ModelKind::Chat | ModelKind::Completions => {
                // A started OpenAI-level stream cannot be continued: only resends apply.
                let policy = MigrationPolicy { resend_limit: self.resend_limit, ..MigrationPolicy::default() };
                let engine = RemoteOpenAIEngine::new(client, self.router_mode).with_migration(policy);
                Ok((Arc::new(engine), ready))
            }
            ModelKind::Backend => {
                let card = fetch_card(&self.runtime, entry, self.card_timeout).await?;
                let remote = match self.router_mode {
                    RouterMode::Kv => {
                        let block_size = KvRouterConfig::with_block_size(entry.kv_cache_block_size).block_size;
                        let router = KvRouter::new(KvRouterConfig { block_size, ..self.kv_config });
                        router.follow_component(endpoint.component()).await?;
                        let remote = RemoteTokenEngine::with_kv_router(client, router);
                        match self.kv_config.scheduler.busy_wait {
                            // Held requests are demand a planner reads off the frontend.
                            Some(_) => remote.with_held_gauge(self.manager.waits().held_busy.with_label_values(&[entry.name.as_str()])),
                            None => remote,
                        }
                    }
                    mode => RemoteTokenEngine::new(client, mode),
                };
                let migration = MigrationPolicy {
                    limit: entry.migration_limit.unwrap_or(self.migration_limit),
                    resend_limit: self.resend_limit,
                    counter: Some(self.manager.migrations().with_label_values(&[entry.name.as_str()])),
                };
                let tokens: Arc<dyn TokenEngine> = Arc::new(remote.with_migration(migration));
                let engine = (self.factory)(card, tokens).map_err(ModelDiscoveryError::Card)?;
                Ok((engine, ready))
            }
        }
    }

    async fn delete(&mut self, key: &str) {
        let Some(gone) = self.entries.remove(key) else { return };
        if self.zero_wait.is_some() && !self.entries.values().any(|e| e.name == gone.name) {
            tracing::info!(model = gone.name, endpoint = %gone.endpoint, "the last worker of this model left; it stays listed (--keep-models)");
            return;
        }
        let covered = |entries: &HashMap<String, ModelEntry>, route: EngineKind, endpoint: &EndpointId| {
            entries.values().any(|e| e.name == gone.name && e.endpoint == *endpoint && routes(e.kind).contains(&route))
        };
        let mut lost = false;
        for &route in routes(gone.kind) {
            let slot = (gone.name.clone(), route);
            if self.built.get(&slot) == Some(&gone.endpoint) && !covered(&self.entries, route, &gone.endpoint) {
                self.built.remove(&slot);
                self.manager.remove_engine(&gone.name, route);
                lost = true;
            }
        }
        if !lost {
            return;
        }
        tracing::info!(model = gone.name, endpoint = %gone.endpoint, "no instance serves this model endpoint any more");
        // Another endpoint may still serve the model: build from it.
        let others: Vec<ModelEntry> = self.entries.values().filter(|e| e.name == gone.name).cloned().collect();
        for entry in others {
            self.build(&entry).await;
        }
    }
}

/// A running [`ModelWatcher`]; dropping it stops the watcher.
#[derive(Debug)]
pub struct ModelWatcherHandle {
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl ModelWatcherHandle {
    /// Stop watching and wait for the task to end.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for ModelWatcherHandle {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            self.cancel.cancel();
            task.abort();
        }
    }
}

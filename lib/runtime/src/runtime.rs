//! `DistributedRuntime`: the one object per process that owns the planes, the
//! cancellation-token tree and graceful shutdown.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::component::{EndpointId, Namespace};
use crate::config::{RequestPlane, RuntimeConfig};
use crate::discovery::{self, Discovery, DiscoveryHealth, MemStore};
use crate::error::{Error, ErrorKind, Result};
use crate::events::EventPlane;
use crate::instances::InstanceWatcher;
use crate::metrics::MetricsRegistry;
use crate::readiness::{NotReady, Readiness};
use crate::transport::{nats_connection, ServedEndpoint, Transport, TransportConfig};

/// Bound on waiting for background tasks after the root token is cancelled.
const TASK_EXIT_BOUND: Duration = Duration::from_secs(2);

pub(crate) struct Registration {
    pub id: EndpointId,
    pub key: String,
    pub endpoint: Arc<ServedEndpoint>,
    pub cancel: CancellationToken,
}

struct Inner {
    config: RuntimeConfig,
    instance_id: u64,
    cancel: CancellationToken,
    tracker: TaskTracker,
    discovery: Arc<dyn Discovery>,
    transport: Arc<Transport>,
    nats: Option<async_nats::Client>,
    events: EventPlane,
    metrics: MetricsRegistry,
    registrations: Mutex<Vec<Registration>>,
    watchers: Mutex<HashMap<String, Arc<InstanceWatcher>>>,
    drained: watch::Sender<bool>,
    closed: watch::Sender<bool>,
    system_address: Mutex<Option<SocketAddr>>,
    readiness: Readiness,
}

/// The process's handle on discovery, the request/response planes and the event plane.
/// Cheap to clone.
#[derive(Clone)]
pub struct DistributedRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DistributedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedRuntime")
            .field("instance_id", &format_args!("{:x}", self.inner.instance_id))
            .field("discovery", &self.inner.config.discovery)
            .field("request_plane", &self.inner.config.request_plane)
            .finish()
    }
}

impl DistributedRuntime {
    /// Start a runtime configured from the environment.
    pub async fn from_env() -> Result<Self> {
        Self::new(RuntimeConfig::from_env()?).await
    }

    /// Start a runtime with `config` (the `mem` backend uses the process-wide store).
    pub async fn new(config: RuntimeConfig) -> Result<Self> {
        Self::with_mem_store(config, MemStore::global()).await
    }

    /// Start a runtime whose `mem` discovery uses `store` (tests run several "processes"
    /// in one process this way).
    pub async fn with_mem_store(config: RuntimeConfig, store: Arc<MemStore>) -> Result<Self> {
        config.validate()?;
        let cancel = CancellationToken::new();
        let tracker = TaskTracker::new();
        // Random and independent of any lease, so it stays the same across lease loss.
        let instance_id = rand::random::<u64>() >> 1;
        let discovery = discovery::connect(&config, cancel.clone(), Some(store)).await?;
        let (nats, nats_events) = match config.needs_nats() {
            true => {
                let (client, events) = nats_connection::connect(&config).await?;
                (Some(client), Some(events))
            }
            false => (None, None),
        };
        let host = config.resolved_tcp_host();
        let transport_config = TransportConfig {
            max_message_size: config.max_message_size,
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            ping_interval: config.tcp_ping_interval,
            peer_timeout: config.tcp_peer_timeout,
        };
        let transport =
            Transport::bind(transport_config, instance_id, &host, config.tcp_port, cancel.clone(), tracker.clone()).await?;
        if let (Some(client), Some(events)) = (&nats, nats_events) {
            nats_connection::spawn_state_watch(events, client.clone(), &transport, config.nats_server.clone());
        }
        let events = match (&config.event_plane, &nats) {
            (crate::config::EventPlane::Nats, Some(client)) => EventPlane::Nats(client.clone()),
            _ => EventPlane::tcp(transport.clone(), discovery.clone()),
        };
        let runtime = DistributedRuntime {
            inner: Arc::new(Inner {
                instance_id,
                cancel,
                tracker,
                discovery,
                transport,
                nats,
                events,
                metrics: MetricsRegistry::new()?,
                registrations: Mutex::new(Vec::new()),
                watchers: Mutex::new(HashMap::new()),
                drained: watch::channel(false).0,
                closed: watch::channel(false).0,
                system_address: Mutex::new(None),
                readiness: Readiness::default(),
                config,
            }),
        };
        // Lease loss under the `shutdown` policy cancels the root token; turn that into an
        // orderly shutdown rather than a half-dead process.
        let rt = runtime.clone();
        runtime.inner.tracker.spawn(async move {
            rt.inner.cancel.cancelled().await;
            if !rt.is_shutting_down() {
                tracing::error!("runtime cancelled from below (lease loss?); shutting down");
                rt.shutdown().await;
            }
        });
        if runtime.inner.config.system_enabled {
            let c = &runtime.inner.config;
            let addr = crate::system_server::start(runtime.clone(), &c.system_host.clone(), c.system_port).await?;
            tracing::info!(%addr, "system server listening");
            *runtime.inner.system_address.lock() = Some(addr);
        }
        tracing::debug!(instance = %format_args!("{instance_id:x}"), address = runtime.inner.transport.address(), "runtime started");
        Ok(runtime)
    }

    /// The configuration the runtime runs with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// This process's instance id: the same for every endpoint it serves, for its whole life.
    pub fn instance_id(&self) -> u64 {
        self.inner.instance_id
    }

    /// The discovery backend.
    pub fn discovery(&self) -> &Arc<dyn Discovery> {
        &self.inner.discovery
    }

    /// What discovery knows about its connection to its store: `Degraded` while the
    /// store cannot be reached or the lease is lost (cached state is being served).
    pub fn discovery_health(&self) -> DiscoveryHealth {
        self.inner.discovery.health()
    }

    /// The event plane.
    pub fn events(&self) -> &EventPlane {
        &self.inner.events
    }

    /// The metrics registry (`/metrics`).
    pub fn metrics(&self) -> &MetricsRegistry {
        &self.inner.metrics
    }

    /// The NATS client, when a plane uses NATS.
    pub fn nats(&self) -> Option<&async_nats::Client> {
        self.inner.nats.as_ref()
    }

    /// The address of the system server, if enabled.
    pub fn system_address(&self) -> Option<SocketAddr> {
        *self.inner.system_address.lock()
    }

    /// The `host:port` of this process's TCP server.
    pub fn tcp_address(&self) -> &str {
        self.inner.transport.address()
    }

    /// A namespace handle.
    pub fn namespace(&self, name: impl Into<String>) -> Result<Namespace> {
        Namespace::new(self.clone(), name.into())
    }

    /// The root cancellation token: cancelled when the runtime shuts down.
    pub fn cancel_token(&self) -> CancellationToken {
        self.inner.cancel.clone()
    }

    /// A child of the root token, for work that must stop with the runtime.
    pub fn child_token(&self) -> CancellationToken {
        self.inner.cancel.child_token()
    }

    pub(crate) fn tracker(&self) -> TaskTracker {
        self.inner.tracker.clone()
    }

    pub(crate) fn transport(&self) -> &Arc<Transport> {
        &self.inner.transport
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.inner.transport.is_shutting_down()
    }

    /// `ns/comp/ep` of every endpoint this process serves.
    pub fn served_endpoints(&self) -> Vec<String> {
        self.inner.registrations.lock().iter().map(|r| r.id.path()).collect()
    }

    /// Hold (`false`) or give (`true`) this process's readiness mark: while held, `/ready`
    /// answers 503 even with endpoints registered; once given, 200 until draining. A
    /// process with an engine to check holds it before it serves and gives it once its
    /// endpoints are registered and the engine answered a first request; one that never
    /// touches it is ready once an endpoint is registered in discovery.
    pub fn set_ready(&self, ready: bool) {
        self.inner.readiness.set_ready(ready);
    }

    /// Whether this process should be sent new requests now (what `/ready` reports):
    /// not while it drains, not while the mark is held, and (mark untouched) not before
    /// an endpoint is registered in discovery.
    pub fn readiness(&self) -> std::result::Result<(), NotReady> {
        let registered = !self.inner.registrations.lock().is_empty();
        self.inner.readiness.check(self.is_shutting_down() || self.inner.cancel.is_cancelled(), registered)
    }

    pub(crate) fn register(&self, registration: Registration) -> Result<()> {
        if self.is_shutting_down() {
            return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down"));
        }
        self.inner.registrations.lock().push(registration);
        Ok(())
    }

    /// The shared watcher of an endpoint's instances (one per endpoint per process).
    pub(crate) async fn instance_watcher(&self, id: &EndpointId) -> Result<Arc<InstanceWatcher>> {
        let key = id.path();
        if let Some(w) = self.inner.watchers.lock().get(&key) {
            return Ok(w.clone());
        }
        let watcher = InstanceWatcher::start(self, id).await?;
        Ok(self.inner.watchers.lock().entry(key).or_insert(watcher).clone())
    }

    /// Resolves once every served endpoint has drained (or the drain bound passed).
    pub async fn drained(&self) {
        let mut rx = self.inner.drained.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Resolves once shutdown has finished.
    pub async fn closed(&self) {
        let mut rx = self.inner.closed.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Shut down gracefully: stop taking requests, drain in-flight streams (bounded by
    /// `DYN_SHUTDOWN_TIMEOUT`), remove registrations and give up the lease, close
    /// connections. Safe to call more than once; later calls wait for the first.
    pub async fn shutdown(&self) {
        if self.inner.transport.begin_shutdown() {
            self.closed().await;
            return;
        }
        let registrations = std::mem::take(&mut *self.inner.registrations.lock());
        // 1. Stop taking requests: unregister first so clients route elsewhere, then refuse.
        for r in &registrations {
            if let Err(e) = self.inner.discovery.delete(&r.key).await {
                tracing::warn!(key = r.key, error = %e, "could not remove registration");
            }
            r.endpoint.draining.store(true, Ordering::Release);
        }
        // 2. Drain in-flight streams, bounded.
        let deadline = Instant::now() + self.inner.config.shutdown_timeout;
        loop {
            let inflight: u64 = registrations.iter().map(|r| r.endpoint.metrics.inflight()).sum();
            if inflight == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(inflight, timeout = ?self.inner.config.shutdown_timeout, "drain bound reached; dropping in-flight streams");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for r in &registrations {
            r.cancel.cancel();
            self.inner.transport.remove_endpoint(&r.id.path());
        }
        self.inner.drained.send_replace(true);
        // 3. Give up the lease, 4. close everything.
        self.inner.discovery.shutdown().await;
        self.inner.cancel.cancel();
        self.inner.transport.fail_all_pending();
        if let Some(nats) = &self.inner.nats {
            // Close the connection now rather than when the last handle is dropped, so a
            // stopped runtime does not keep reconnecting to a NATS server that went away.
            let _ = tokio::time::timeout(TASK_EXIT_BOUND, nats.drain()).await;
        }
        self.inner.tracker.close();
        if tokio::time::timeout(TASK_EXIT_BOUND, self.inner.tracker.wait()).await.is_err() {
            tracing::debug!("some background tasks outlived the shutdown bound");
        }
        self.inner.closed.send_replace(true);
    }

    /// Whether the planes this process uses can carry traffic now: `Err` with the reason
    /// when a plane runs over NATS and the NATS connection is down (it reconnects by
    /// itself; requests over NATS fail with `Unavailable` meanwhile).
    pub fn planes_health(&self) -> std::result::Result<(), String> {
        match &self.inner.nats {
            Some(client) => nats_connection::check_connected(client, &self.inner.config.nats_server).map_err(|e| e.message().to_string()),
            None => Ok(()),
        }
    }

    /// Whether this process can do its work now (what `/health` reports): `Err(reason)`
    /// while it shuts down or has shut down, while a NATS plane is disconnected, or once
    /// discovery has been degraded for longer than `DYN_DISCOVERY_HEALTH_GRACE` (until
    /// then it serves on what discovery last said, which is fine).
    pub fn health(&self) -> std::result::Result<(), String> {
        if self.is_shutting_down() || self.inner.cancel.is_cancelled() {
            return Err("the runtime is shutting down".to_string());
        }
        self.planes_health()?;
        if let DiscoveryHealth::Degraded { since, reason } = self.discovery_health() {
            let grace = self.inner.config.discovery_health_grace;
            if since.elapsed() >= grace {
                return Err(format!(
                    "discovery ({}) degraded for {:.0?} (DYN_DISCOVERY_HEALTH_GRACE {grace:?}): {reason}",
                    self.inner.config.discovery.as_str(),
                    since.elapsed()
                ));
            }
        }
        Ok(())
    }

    /// The NATS client, if connected now; `Unavailable` at once when the connection is
    /// down, `Config` when this process has none.
    pub(crate) fn connected_nats(&self, instance: u64) -> Result<&async_nats::Client> {
        self.check_plane(RequestPlane::Nats, instance)?;
        let client = self.inner.nats.as_ref().ok_or_else(|| Error::new(ErrorKind::Config, "no NATS client"))?;
        nats_connection::check_connected(client, &self.inner.config.nats_server)?;
        Ok(client)
    }

    /// Whether requests from this process can reach an instance registered with `plane`.
    pub(crate) fn check_plane(&self, plane: RequestPlane, instance: u64) -> Result<()> {
        if plane == RequestPlane::Nats && self.inner.nats.is_none() {
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "instance {instance:x} takes requests over NATS but this process has no NATS connection \
                     (set DYN_REQUEST_PLANE=nats and NATS_SERVER)"
                ),
            ));
        }
        Ok(())
    }
}

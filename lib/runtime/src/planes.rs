//! `Planes`: what clients, instance watchers, served endpoints and the system server use
//! of a runtime — its configuration, discovery, the request/response and event planes,
//! the metrics registry, the cancellation tree and the endpoints it serves — without the
//! runtime's start-up and shutdown. `DistributedRuntime` owns one and hands out clones,
//! so those rooms never import `runtime.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::{RequestPlane, RuntimeConfig};
use crate::discovery::{Discovery, DiscoveryHealth};
use crate::drain::DrainGate;
use crate::error::{Error, ErrorKind, Result};
use crate::events::EventPlane;
use crate::instance::EndpointId;
use crate::instances::InstanceWatcher;
use crate::metrics::MetricsRegistry;
use crate::readiness::{NotReady, Readiness};
use crate::transport::{ServedEndpoint, Transport};

/// An endpoint this process serves, as shutdown and drain need it.
#[derive(Clone)]
pub(crate) struct Registration {
    /// `ns/comp/ep`.
    pub path: String,
    /// Its instance key in discovery.
    pub key: String,
    /// The instance record under `key` (written again on resume).
    pub value: bytes::Bytes,
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
    readiness: Readiness,
    drain: DrainGate,
}

/// The planes of one runtime, shared by everything that talks over them. Cheap to clone.
#[derive(Clone)]
pub struct Planes {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Planes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Planes")
            .field("instance_id", &format_args!("{:x}", self.inner.instance_id))
            .field("discovery", &self.inner.config.discovery)
            .field("request_plane", &self.inner.config.request_plane)
            .finish()
    }
}

/// What [`Planes::new`] assembles.
pub(crate) struct PlaneParts {
    pub config: RuntimeConfig,
    pub instance_id: u64,
    pub cancel: CancellationToken,
    pub tracker: TaskTracker,
    pub discovery: Arc<dyn Discovery>,
    pub transport: Arc<Transport>,
    pub nats: Option<async_nats::Client>,
    pub events: EventPlane,
    pub metrics: MetricsRegistry,
}

impl Planes {
    pub(crate) fn new(parts: PlaneParts) -> Self {
        let PlaneParts { config, instance_id, cancel, tracker, discovery, transport, nats, events, metrics } = parts;
        Planes {
            inner: Arc::new(Inner {
                config,
                instance_id,
                cancel,
                tracker,
                discovery,
                transport,
                nats,
                events,
                metrics,
                registrations: Mutex::new(Vec::new()),
                watchers: Mutex::new(HashMap::new()),
                drained: watch::channel(false).0,
                readiness: Readiness::default(),
                drain: DrainGate::default(),
            }),
        }
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

    /// The `host:port` of this process's TCP server.
    pub fn tcp_address(&self) -> &str {
        self.inner.transport.address()
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
        self.inner.registrations.lock().iter().map(|r| r.path.clone()).collect()
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
        let draining = self.is_shutting_down() || self.inner.cancel.is_cancelled() || self.inner.drain.is_draining();
        self.inner.readiness.check(draining, registered)
    }

    pub(crate) fn register(&self, registration: Registration) -> Result<()> {
        if self.is_shutting_down() {
            return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down"));
        }
        self.inner.registrations.lock().push(registration);
        Ok(())
    }

    /// Every registration now (clones), for drain and its status.
    pub(crate) fn registrations(&self) -> Vec<Registration> {
        self.inner.registrations.lock().clone()
    }

    /// The drain flag (see `drain.rs`).
    pub(crate) fn drain_gate(&self) -> &DrainGate {
        &self.inner.drain
    }

    /// Every registration, for shutdown to unregister and drain.
    pub(crate) fn take_registrations(&self) -> Vec<Registration> {
        std::mem::take(&mut *self.inner.registrations.lock())
    }

    /// The shared watcher of an endpoint's instances (one per endpoint per process).
    pub(crate) async fn instance_watcher(&self, id: &EndpointId) -> Result<Arc<InstanceWatcher>> {
        let key = id.path();
        if let Some(w) = self.inner.watchers.lock().get(&key) {
            return Ok(w.clone());
        }
        let watcher = InstanceWatcher::start(&self.inner.discovery, &self.inner.transport, id).await?;
        Ok(self.inner.watchers.lock().entry(key).or_insert(watcher).clone())
    }

    /// Resolves once every served endpoint has drained (or the drain bound passed).
    pub async fn drained(&self) {
        let mut rx = self.inner.drained.subscribe();
        let _ = rx.wait_for(|d| *d).await;
    }

    /// Shutdown has drained the served endpoints: wake [`Planes::drained`].
    pub(crate) fn mark_drained(&self) {
        self.inner.drained.send_replace(true);
    }

    /// Whether the planes this process uses can carry traffic now: `Err` with the reason
    /// when a plane runs over NATS and the NATS connection is down (it reconnects by
    /// itself; requests over NATS fail with `Unavailable` meanwhile).
    pub fn planes_health(&self) -> std::result::Result<(), String> {
        match &self.inner.nats {
            Some(client) => crate::nats::check_connected(client, &self.inner.config.nats_server).map_err(|e| e.message().to_string()),
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
        crate::nats::check_connected(client, &self.inner.config.nats_server)?;
        Ok(client)
    }

    /// Whether requests from this process can reach an instance registered with `plane`.
    fn check_plane(&self, plane: RequestPlane, instance: u64) -> Result<()> {
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

//! `DistributedRuntime`: the one object per process that owns the planes, the
//! cancellation-token tree and graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::RuntimeConfig;
use crate::discovery::{self, MemStore};
use crate::drain;
use crate::error::Result;
use crate::events::EventPlane;
use crate::metrics::MetricsRegistry;
use crate::planes::{PlaneParts, Planes};
use crate::transport::{nats_connection, Transport, TransportConfig};

/// Bound on waiting for background tasks after the root token is cancelled.
const TASK_EXIT_BOUND: Duration = Duration::from_secs(2);

struct Inner {
    planes: Planes,
    closed: watch::Sender<bool>,
    system_address: Mutex<Option<SocketAddr>>,
}

/// The process's handle on discovery, the request/response planes and the event plane,
/// and their lifecycle (start-up, graceful shutdown). Cheap to clone. It dereferences to
/// its [`Planes`], whose accessors (`config()`, `discovery()`, `events()`,
/// `namespace()`…) it offers that way.
#[derive(Clone)]
pub struct DistributedRuntime {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for DistributedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedRuntime").field("planes", &self.inner.planes).finish()
    }
}

impl std::ops::Deref for DistributedRuntime {
    type Target = Planes;

    fn deref(&self) -> &Planes {
        &self.inner.planes
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
                let (client, events) = crate::nats::connect(&config).await?;
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
        let planes = Planes::new(PlaneParts {
            config,
            instance_id,
            cancel,
            tracker,
            discovery,
            transport,
            nats,
            events,
            metrics: MetricsRegistry::new()?,
        });
        let runtime = DistributedRuntime {
            inner: Arc::new(Inner { planes, closed: watch::channel(false).0, system_address: Mutex::new(None) }),
        };
        // Lease loss under the `shutdown` policy cancels the root token; turn that into an
        // orderly shutdown rather than a half-dead process.
        let rt = runtime.clone();
        runtime.tracker().spawn(async move {
            rt.cancel_token().cancelled().await;
            if !rt.is_shutting_down() {
                tracing::error!("runtime cancelled from below (lease loss?); shutting down");
                rt.shutdown().await;
            }
        });
        if runtime.config().system_enabled {
            let c = runtime.config();
            let addr = crate::system_server::start(runtime.planes().clone(), &c.system_host.clone(), c.system_port).await?;
            tracing::info!(%addr, "system server listening");
            if let Some(path) = &c.system_port_file {
                crate::system_server::write_port_file(path, addr.port())?;
            }
            *runtime.inner.system_address.lock() = Some(addr);
        }
        tracing::debug!(instance = %format_args!("{instance_id:x}"), address = runtime.tcp_address(), "runtime started");
        Ok(runtime)
    }

    /// The planes, for a room that needs them without the runtime's lifecycle.
    pub fn planes(&self) -> &Planes {
        &self.inner.planes
    }

    /// The address of the system server, if enabled.
    pub fn system_address(&self) -> Option<SocketAddr> {
        *self.inner.system_address.lock()
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
        let planes = &self.inner.planes;
        let transport = planes.transport();
        if transport.begin_shutdown() {
            self.closed().await;
            return;
        }
        let registrations = planes.registrations();
        // 1. Stop taking requests: unregister first so clients route elsewhere, then refuse
        // (the one drain path, `drain.rs`, which `POST /drain` takes too).
        drain::unregister(planes, &registrations).await;
        // 2. Drain in-flight streams, bounded.
        let shutdown_timeout = planes.config().shutdown_timeout;
        let deadline = Instant::now() + shutdown_timeout;
        loop {
            let inflight = drain::inflight(&registrations);
            if inflight == 0 {
                break;
            }
            if Instant::now() >= deadline {
                // Ended as a drain deadline ends them: `Unavailable`, which a caller's
                // migration continues elsewhere, and which says why to one without it.
                let ended = drain::cut(&registrations, "the instance shut down: its drain bound (DYN_SHUTDOWN_TIMEOUT) passed");
                tracing::warn!(inflight, ended, timeout = ?shutdown_timeout, "drain bound reached; ended the streams still in flight");
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for r in &planes.take_registrations() {
            r.cancel.cancel();
            transport.remove_endpoint(&r.path);
        }
        planes.mark_drained();
        // 3. Give up the lease, 4. close everything.
        planes.discovery().shutdown().await;
        planes.cancel_token().cancel();
        transport.fail_all_pending();
        if let Some(nats) = planes.nats() {
            // Close the connection now rather than when the last handle is dropped, so a
            // stopped runtime does not keep reconnecting to a NATS server that went away.
            let _ = tokio::time::timeout(TASK_EXIT_BOUND, nats.drain()).await;
        }
        let tracker = planes.tracker();
        tracker.close();
        if tokio::time::timeout(TASK_EXIT_BOUND, tracker.wait()).await.is_err() {
            tracing::debug!("some background tasks outlived the shutdown bound");
        }
        self.inner.closed.send_replace(true);
    }
}

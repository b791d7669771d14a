//! Calling an endpoint: pick an instance (round-robin, random or a given id), send the
//! request on the plane the instance registered with, return its response stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;

use crate::instance::{EndpointId, Instance, InstanceTransport};
use crate::error::{Error, ErrorKind, Result};
use crate::instances::InstanceWatcher;
use crate::planes::Planes;
use crate::transport::response_stream::{ResponseStream, StreamBounds};
use crate::transport::nats;

/// How often a long `wait_for_instances` says what it is waiting for.
const WAIT_LOG_INTERVAL: Duration = Duration::from_secs(5);
/// Wait between two probes of an unresponsive NATS instance.
const PROBE_INTERVAL: Duration = Duration::from_secs(1);
/// Instances tried per request when the first ones are unreachable (not for `Direct`).
const MAX_ATTEMPTS: usize = 3;

/// How a request picks its instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterMode {
    /// Each instance in turn.
    RoundRobin,
    /// Uniformly at random.
    Random,
    /// This instance id, or an error.
    Direct(u64),
}

/// Per-request settings for [`Client::send_with`]; `Default` takes everything from the
/// runtime configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SendOptions {
    /// The request id the handler's context sees (default: a fresh UUID).
    pub request_id: Option<String>,
    /// Bound on waiting for the first item (default `DYN_STREAM_FIRST_ITEM_TIMEOUT`);
    /// `Some(Duration::ZERO)` waits forever.
    pub first_item_timeout: Option<Duration>,
    /// Bound on the gap between two items (default `DYN_STREAM_ITEM_TIMEOUT`);
    /// `Some(Duration::ZERO)` waits forever.
    pub item_timeout: Option<Duration>,
}

/// A client of one endpoint. Cheap to clone; clones share the round-robin counter.
#[derive(Clone)]
pub struct Client {
    planes: Planes,
    endpoint: EndpointId,
    watcher: Arc<InstanceWatcher>,
    counter: Arc<AtomicUsize>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("endpoint", &self.endpoint.to_string()).finish()
    }
}

impl Client {
    pub(crate) async fn new(planes: Planes, endpoint: EndpointId) -> Result<Self> {
        let watcher = planes.instance_watcher(&endpoint).await?;
        // A random start, so that one-shot clients (a fresh client per request) spread
        // over the instances instead of all picking the first.
        let start = rand::random::<u32>() as usize;
        Ok(Client { planes, endpoint, watcher, counter: Arc::new(AtomicUsize::new(start)) })
    }

    /// The endpoint this client calls.
    pub fn endpoint(&self) -> &EndpointId {
        &self.endpoint
    }

    /// The registered instances, ordered by id.
    pub fn instances(&self) -> Vec<Instance> {
        self.watcher.instances().as_ref().clone()
    }

    /// The ids of the registered instances, ascending.
    pub fn instance_ids(&self) -> Vec<u64> {
        self.watcher.instances().iter().map(|i| i.instance_id).collect()
    }

    /// The ids of the instances requests are routed to now: registered and not marked
    /// down in this process (unreachable, or not answering pings), ascending.
    pub fn routable_instance_ids(&self) -> Vec<u64> {
        self.watcher.routable().iter().map(|i| i.instance_id).collect()
    }

    /// Skip `instance_id` for a couple of seconds in every client of this process: it
    /// refused a request (draining) or lost one before its first item.
    pub fn mark_down(&self, instance_id: u64) {
        self.watcher.mark_down(instance_id);
    }

    /// Take `instance_id` out of routing in every client of this process until it answers
    /// again: it did not take a request, or went silent, within its bound. A TCP
    /// instance's address is probed with pings, a NATS instance's subject with NATS pings
    /// (every [`PROBE_INTERVAL`], each bounded by `DYN_TCP_PEER_TIMEOUT`); an instance
    /// that leaves discovery is forgotten.
    pub fn mark_unresponsive(&self, instance_id: u64) {
        let Some(instance) = self.watcher.instances().iter().find(|i| i.instance_id == instance_id).cloned() else {
            return;
        };
        let transport = self.planes.transport().clone();
        let subject = match instance.transport {
            InstanceTransport::Tcp(address) => {
                transport.mark_address_down(&address, "did not take or answer a request in time");
                return;
            }
            InstanceTransport::Nats(subject) => subject,
        };
        if !transport.mark_unresponsive(instance_id) {
            return;
        }
        tracing::warn!(instance = %format_args!("{instance_id:x}"), endpoint = %self.endpoint, "instance did not take a request in time; routing around it until it answers a ping");
        let (client, cancel, timeout) = (self.clone(), self.planes.cancel_token(), self.planes.config().tcp_peer_timeout);
        self.planes.tracker().spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(PROBE_INTERVAL) => {}
                    _ = cancel.cancelled() => return,
                }
                let registered = client.watcher.instances().iter().any(|i| i.instance_id == instance_id);
                let answered = registered
                    && match client.planes.connected_nats(instance_id) {
                        Ok(nats) => nats::ping(nats, &subject, timeout).await,
                        Err(_) => false,
                    };
                if !registered || answered {
                    transport.clear_unresponsive(instance_id);
                    if answered {
                        tracing::info!(instance = %format_args!("{instance_id:x}"), "instance answers again; routing to it");
                    }
                    return;
                }
            }
        });
    }

    /// Wait until at least one instance is registered; `None` waits until the runtime
    /// shuts down (logging every few seconds what it waits for).
    pub async fn wait_for_instances(&self, timeout: Option<Duration>) -> Result<Vec<u64>> {
        let start = Instant::now();
        let cancel = self.planes.cancel_token();
        loop {
            let step = match timeout {
                Some(t) => {
                    let left = t.saturating_sub(start.elapsed());
                    if left.is_zero() {
                        return Err(Error::new(
                            ErrorKind::Timeout,
                            format!("no instance of {} appeared within {t:?} (discovery: {})", self.endpoint, self.planes.config().discovery.as_str()),
                        ));
                    }
                    left.min(WAIT_LOG_INTERVAL)
                }
                None => WAIT_LOG_INTERVAL,
            };
            tokio::select! {
                found = tokio::time::timeout(step, self.watcher.wait_for_any()) => {
                    if let Ok(found) = found {
                        return Ok(found.iter().map(|i| i.instance_id).collect());
                    }
                }
                _ = cancel.cancelled() => return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down")),
            }
            tracing::info!(
                endpoint = %self.endpoint,
                discovery = self.planes.config().discovery.as_str(),
                waited = ?start.elapsed(),
                "still waiting for an instance"
            );
        }
    }

    /// Send with the default mode (round-robin).
    pub async fn generate(&self, body: Bytes) -> Result<ResponseStream> {
        self.send(RouterMode::RoundRobin, body, None).await
    }

    /// Send to each instance in turn.
    pub async fn round_robin(&self, body: Bytes) -> Result<ResponseStream> {
        self.send(RouterMode::RoundRobin, body, None).await
    }

    /// Send to a random instance.
    pub async fn random(&self, body: Bytes) -> Result<ResponseStream> {
        self.send(RouterMode::Random, body, None).await
    }

    /// Send to `instance_id`.
    pub async fn direct(&self, body: Bytes, instance_id: u64) -> Result<ResponseStream> {
        self.send(RouterMode::Direct(instance_id), body, None).await
    }

    /// Send `body` to the instance `mode` picks, with the configured stream bounds. See
    /// [`Client::send_with`].
    pub async fn send(&self, mode: RouterMode, body: Bytes, request_id: Option<String>) -> Result<ResponseStream> {
        self.send_with(mode, body, SendOptions { request_id, ..Default::default() }).await
    }

    /// Send `body` to the instance `mode` picks. An instance that cannot be reached is
    /// skipped and the next one tried (except with `Direct`); a request refused or lost
    /// before its first item is resent to another instance, up to three in all. The
    /// stream fails with `Timeout` when the first item or the next one takes longer than
    /// the bounds in `options`.
    pub async fn send_with(&self, mode: RouterMode, body: Bytes, options: SendOptions) -> Result<ResponseStream> {
        let request_id = options.request_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let config = self.planes.config();
        let bound = |given: Option<Duration>, default: Option<Duration>| given.or(default).filter(|d| !d.is_zero());
        let bounds = StreamBounds {
            first_item: bound(options.first_item_timeout, config.stream_first_item_timeout),
            item: bound(options.item_timeout, config.stream_item_timeout),
        };
        self.send_attempts(mode, body, request_id, bounds, MAX_ATTEMPTS).await
    }

    /// Boxed (not `async fn`) so the resend closure can call it again without making
    /// the future's type recursive.
    fn send_attempts(
        &self,
        mode: RouterMode,
        body: Bytes,
        request_id: String,
        bounds: StreamBounds,
        attempts: usize,
    ) -> BoxFuture<'static, Result<ResponseStream>> {
        let this = self.clone();
        Box::pin(async move {
            let mut last_error: Option<Error> = None;
            for attempt in 0..attempts {
                let instance = match this.pick(mode, attempt) {
                    Ok(i) => i,
                    Err(e) => {
                        return Err(match last_error {
                            Some(last) => Error::new(e.kind(), format!("{} (last failure: {})", e.message(), last.full_message())),
                            None => e,
                        })
                    }
                };
                if let InstanceTransport::Nats(_) = instance.transport {
                    // NATS itself is down: every NATS instance fails alike, and none is at fault.
                    this.planes.connected_nats(instance.instance_id)?;
                }
                match this.send_to(&instance, &request_id, body.clone()).await {
                    Ok(mut stream) => {
                        stream.set_bounds(bounds);
                        let left = attempts - attempt - 1;
                        if left > 0 && !matches!(mode, RouterMode::Direct(_)) {
                            // Refused (draining) or lost (died, stopped answering) before
                            // any item: mark it down and send to another instance.
                            let client = this.clone();
                            let down = instance.instance_id;
                            let (body, request_id) = (body.clone(), request_id.clone());
                            stream.set_resend(Box::new(move || {
                                client.watcher.mark_down(down);
                                client.send_attempts(mode, body, request_id, bounds, left)
                            }));
                        }
                        return Ok(stream);
                    }
                    Err(e) if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Disconnected) => {
                        tracing::debug!(instance = %format_args!("{:x}", instance.instance_id), error = %e.full_message(), "instance unreachable");
                        this.watcher.mark_down(instance.instance_id);
                        if matches!(mode, RouterMode::Direct(_)) {
                            return Err(e);
                        }
                        last_error = Some(e);
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(last_error.unwrap_or_else(|| Error::new(ErrorKind::NoInstances, format!("no instance of {}", this.endpoint))))
        })
    }

    fn pick(&self, mode: RouterMode, attempt: usize) -> Result<Instance> {
        // `Direct` means that instance, down or not: the caller chose it.
        let instances = match mode {
            RouterMode::Direct(_) => self.watcher.instances(),
            _ => self.watcher.routable(),
        };
        if instances.is_empty() {
            let registered = self.watcher.instances().len();
            let message = match registered {
                0 => format!("no instances of {} are registered", self.endpoint),
                n => format!("all {n} registered instances of {} are unreachable or not answering", self.endpoint),
            };
            return Err(Error::new(ErrorKind::NoInstances, message));
        }
        let index = match mode {
            RouterMode::RoundRobin => self.counter.fetch_add(1, Ordering::Relaxed),
            RouterMode::Random => rand::random::<u32>() as usize + attempt,
            RouterMode::Direct(id) => {
                return instances.iter().find(|i| i.instance_id == id).cloned().ok_or_else(|| {
                    Error::new(
                        ErrorKind::InstanceNotFound,
                        format!("instance {id} ({id:x}) of {} is not registered; known: {:?}", self.endpoint, self.instance_ids()),
                    )
                })
            }
        };
        Ok(instances[index % instances.len()].clone())
    }

    async fn send_to(&self, instance: &Instance, request_id: &str, body: Bytes) -> Result<ResponseStream> {
        let path = self.endpoint.path();
        match &instance.transport {
            InstanceTransport::Tcp(address) => {
                self.planes.transport().send_tcp(address, &path, request_id, body).await
            }
            InstanceTransport::Nats(subject) => {
                let client = self.planes.connected_nats(instance.instance_id)?;
                nats::send(client, self.planes.transport(), subject, &path, request_id, body).await
            }
        }
    }
}

//! Which peers this process must not route to, shared by every client of every
//! endpoint in the process.
//!
//! An address whose connection died of a ping timeout, or that refused or timed out a
//! connect, is *down* until a probe connects to it again and gets a Pong (or discovery
//! registers an instance there anew). An instance that refused a request (draining) or
//! whose stream broke is skipped for a short while instead: discovery removes it soon.
//! An instance on the NATS plane that did not take a request in time is *unresponsive*
//! until a NATS ping to its subject is answered (see `Client::mark_unresponsive`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::Transport;

/// How long an instance marked down by id is skipped.
pub(crate) const INSTANCE_DOWN_FOR: Duration = Duration::from_secs(2);
/// First wait between probes of a down address, and the longest.
const PROBE_BACKOFF_FIRST: Duration = Duration::from_secs(1);
const PROBE_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// A down address no client asked about for this long is forgotten and its probe stops
/// (discovery most likely dropped the instance). Long, because forgetting a live-but-
/// silent peer costs the next request there a peer timeout (then a resend).
const FORGET_UNASKED: Duration = Duration::from_secs(600);

struct DownAddress {
    reason: String,
    last_asked: Instant,
}

/// The process's down marks: sticky by address, timed by instance id.
#[derive(Default)]
pub(super) struct PeerHealth {
    addresses: Mutex<HashMap<String, DownAddress>>,
    instances: Mutex<HashMap<u64, Instant>>,
    unresponsive: Mutex<HashSet<u64>>,
}

impl Transport {
    /// Take `address` out of routing until it answers a ping again; starts its probe.
    pub(crate) fn mark_address_down(self: &Arc<Self>, address: &str, reason: &str) {
        {
            let mut down = self.health.addresses.lock();
            if down.contains_key(address) {
                return;
            }
            down.insert(address.to_string(), DownAddress { reason: reason.to_string(), last_asked: Instant::now() });
        }
        if self.cancel.is_cancelled() {
            return;
        }
        tracing::warn!(address, reason, "peer marked down; routing around it until it answers again");
        let transport = self.clone();
        let address = address.to_string();
        self.tracker.spawn(async move { transport.probe(address).await });
    }

    /// Whether `address` is marked down (see [`Transport::mark_address_down`]).
    pub(crate) fn is_address_down(&self, address: &str) -> bool {
        match self.health.addresses.lock().get_mut(address) {
            Some(d) => {
                d.last_asked = Instant::now();
                true
            }
            None => false,
        }
    }

    /// Discovery registered an instance at `address` anew: give it a chance at once.
    pub(crate) fn clear_address(&self, address: &str) {
        if self.health.addresses.lock().remove(address).is_some() {
            tracing::info!(address, "a new registration at a down address; routing to it again");
        }
    }

    /// Skip instance `id` for [`INSTANCE_DOWN_FOR`].
    pub(crate) fn mark_instance_down(&self, id: u64) {
        self.health.instances.lock().insert(id, Instant::now() + INSTANCE_DOWN_FOR);
    }

    /// Whether instance `id` is within its timed down mark.
    pub(crate) fn is_instance_down(&self, id: u64) -> bool {
        let mut down = self.health.instances.lock();
        if down.is_empty() {
            return false;
        }
        let now = Instant::now();
        down.retain(|_, until| *until > now);
        down.contains_key(&id)
    }

    /// Take instance `id` out of routing until [`Transport::clear_unresponsive`]; returns
    /// whether it was not marked yet (the caller then starts its probe).
    pub(crate) fn mark_unresponsive(&self, id: u64) -> bool {
        self.health.unresponsive.lock().insert(id)
    }

    /// Instance `id` answered again (or is gone): route to it again.
    pub(crate) fn clear_unresponsive(&self, id: u64) {
        self.health.unresponsive.lock().remove(&id);
    }

    /// Whether instance `id` is marked unresponsive.
    pub(crate) fn is_unresponsive(&self, id: u64) -> bool {
        let unresponsive = self.health.unresponsive.lock();
        !unresponsive.is_empty() && unresponsive.contains(&id)
    }

    /// Reconnect to a down address with backoff until a connection opens and answers a
    /// ping; then clear the mark.
    async fn probe(self: Arc<Self>, address: String) {
        let mut backoff = PROBE_BACKOFF_FIRST;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.cancel.cancelled() => return,
            }
            backoff = (backoff * 2).min(PROBE_BACKOFF_MAX);
            {
                let mut down = self.health.addresses.lock();
                match down.get(&address) {
                    None => return,
                    Some(d) if d.last_asked.elapsed() > FORGET_UNASKED => {
                        down.remove(&address);
                        return;
                    }
                    Some(_) => {}
                }
            }
            let Ok(conn) = self.connection(&address).await else { continue };
            if conn.ping(self.config.peer_timeout).await {
                if let Some(d) = self.health.addresses.lock().remove(&address) {
                    tracing::info!(address, was = d.reason, "peer answers again; routing to it");
                }
                return;
            }
        }
    }
}

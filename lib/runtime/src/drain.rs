//! Draining: taking this process's instances out of routing and, for an operator, putting
//! them back. One path for both callers: the system server's `POST /drain` and
//! `POST /resume` (a drain the process survives), and shutdown (SIGTERM = drain, wait for
//! in-flight streams within `DYN_SHUTDOWN_TIMEOUT`, exit).
//!
//! Draining deletes each served endpoint's instance key from discovery (routers stop
//! picking the instance as their watches see the delete) and makes the endpoint refuse
//! a request that still arrives, as unavailable and before any item, so the caller
//! resends it to another instance. In-flight streams go on to their end. Resuming writes
//! the keys again (bound to the process's lease) and takes requests again.

use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use crate::error::{Error, ErrorKind, Result};
use crate::planes::{Planes, Registration};

/// Whether this process takes new requests, as `GET /state` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServingState {
    /// Registered and taking requests.
    Serving,
    /// Out of routing; streams still in flight.
    Draining,
    /// Out of routing, nothing in flight.
    Drained,
}

/// What `POST /drain`, `POST /resume` and `GET /state` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DrainStatus {
    /// Serving, draining or drained.
    pub state: ServingState,
    /// Requests this process's endpoints are serving now.
    pub inflight: u64,
}

/// The drain flag of a process and the lock that orders drains and resumes.
#[derive(Debug, Default)]
pub(crate) struct DrainGate {
    draining: AtomicBool,
    order: tokio::sync::Mutex<()>,
}

impl DrainGate {
    /// Whether an operator's drain is in force.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

/// Take `registrations` out of routing: delete their instance keys, then refuse what
/// still arrives. A key that cannot be deleted is logged; the refusal still holds.
pub(crate) async fn unregister(planes: &Planes, registrations: &[Registration]) {
    for r in registrations {
        if let Err(e) = planes.discovery().delete(&r.key).await {
            tracing::warn!(key = r.key, error = %e, "could not remove registration");
        }
        r.endpoint.draining.store(true, Ordering::Release);
    }
}

/// Requests the endpoints of `registrations` are serving now.
pub(crate) fn inflight(registrations: &[Registration]) -> u64 {
    registrations.iter().map(|r| r.endpoint.metrics.inflight()).sum()
}

impl Planes {
    /// Stop taking new requests without exiting: this process's instances leave
    /// discovery, `/ready` answers 503 (`draining`), in-flight streams go on to their end.
    /// Idempotent; answers the progress (the count still in flight).
    pub async fn drain(&self) -> Result<DrainStatus> {
        let gate = self.drain_gate();
        let _order = gate.order.lock().await;
        if self.is_shutting_down() {
            return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down"));
        }
        if !gate.draining.swap(true, Ordering::AcqRel) {
            let registrations = self.registrations();
            unregister(self, &registrations).await;
            tracing::info!(endpoints = registrations.len(), inflight = inflight(&registrations), "draining (operator)");
        }
        Ok(self.drain_status())
    }

    /// Take requests again after [`Planes::drain`]: write the instance keys again and
    /// stop refusing. Idempotent; fails while the runtime shuts down (no resume from
    /// SIGTERM) or when discovery refuses a key (the rest stay written; call again).
    pub async fn resume(&self) -> Result<DrainStatus> {
        let gate = self.drain_gate();
        let _order = gate.order.lock().await;
        if self.is_shutting_down() {
            return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down"));
        }
        if gate.is_draining() {
            let registrations = self.registrations();
            for r in &registrations {
                self.discovery().put_leased(&r.key, r.value.clone()).await?;
                r.endpoint.draining.store(false, Ordering::Release);
            }
            gate.draining.store(false, Ordering::Release);
            tracing::info!(endpoints = registrations.len(), "serving again (operator resume)");
        }
        Ok(self.drain_status())
    }

    /// Serving, draining (by an operator or shutdown) or drained, with the count in flight.
    pub fn drain_status(&self) -> DrainStatus {
        let inflight = inflight(&self.registrations());
        let state = if !(self.drain_gate().is_draining() || self.is_shutting_down()) {
            ServingState::Serving
        } else if inflight > 0 {
            ServingState::Draining
        } else {
            ServingState::Drained
        };
        DrainStatus { state, inflight }
    }
}

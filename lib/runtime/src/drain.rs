//! Draining: taking this process's instances out of routing and, for an operator, putting
//! them back. One path for both callers: the system server's `POST /drain` and
//! `POST /resume` (a drain the process survives), and shutdown (SIGTERM = drain, wait for
//! in-flight streams within `DYN_SHUTDOWN_TIMEOUT`, exit).
//!
//! Draining deletes each served endpoint's instance key from discovery (routers stop
//! picking the instance as their watches see the delete) and makes the endpoint refuse
//! a request that still arrives, as unavailable and before any item, so the caller
//! resends it to another instance. In-flight streams go on to their end — or, with a
//! deadline, until it: then each still running is ended with an `Unavailable` error,
//! which a frontend's migration continues on another instance. Resuming writes the keys
//! again (bound to the process's lease), drops a pending deadline and takes requests
//! again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DrainStatus {
    /// Serving, draining or drained.
    pub state: ServingState,
    /// Requests this process's endpoints are serving now.
    pub inflight: u64,
    /// Seconds until the drain's deadline ends the streams still in flight (0 once it
    /// passed); `None` without a deadline.
    pub deadline_in_s: Option<f64>,
    /// Streams the deadlines of this process's drains ended (for migration elsewhere).
    pub cut: u64,
}

/// The drain flag of a process, its deadline, and the lock that orders drains and resumes.
#[derive(Debug, Default)]
pub(crate) struct DrainGate {
    draining: AtomicBool,
    order: tokio::sync::Mutex<()>,
    /// When the streams still in flight are ended, if a drain set a deadline.
    deadline: Mutex<Option<Instant>>,
    /// The task that ends them at the deadline; aborted by a resume or a new deadline.
    cutter: Mutex<Option<JoinHandle<()>>>,
    cut: AtomicU64,
}

impl Drop for DrainGate {
    fn drop(&mut self) {
        if let Some(task) = self.cutter.get_mut().take() {
            task.abort();
        }
    }
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

/// End the streams the endpoints of `registrations` still serve, with an `Unavailable`
/// error (continued elsewhere by a frontend's migration); how many.
pub(crate) fn cut(registrations: &[Registration], message: &str) -> u64 {
    registrations.iter().map(|r| r.endpoint.inflight.cut(message) as u64).sum()
}

/// Requests the endpoints of `registrations` are serving now.
pub(crate) fn inflight(registrations: &[Registration]) -> u64 {
    registrations.iter().map(|r| r.endpoint.metrics.inflight()).sum()
}

impl Planes {
    /// Stop taking new requests without exiting: this process's instances leave
    /// discovery, `/ready` answers 503 (`draining`), in-flight streams go on to their end
    /// or, with `deadline`, until it passes: those still running then end with an
    /// `Unavailable` error, for the caller to continue elsewhere. Idempotent; a later
    /// call's deadline replaces the pending one. Answers the progress.
    pub async fn drain(&self, deadline: Option<Duration>) -> Result<DrainStatus> {
        let gate = self.drain_gate();
        let _order = gate.order.lock().await;
        if self.is_shutting_down() {
            return Err(Error::new(ErrorKind::Shutdown, "the runtime is shutting down"));
        }
        if !gate.draining.swap(true, Ordering::AcqRel) {
            let registrations = self.registrations();
            unregister(self, &registrations).await;
            tracing::info!(endpoints = registrations.len(), inflight = inflight(&registrations), ?deadline, "draining (operator)");
        }
        if let Some(after) = deadline {
            let at = Instant::now() + after;
            *gate.deadline.lock() = Some(at);
            let planes = self.clone();
            let task = tokio::spawn(async move {
                tokio::time::sleep_until(at).await;
                let registrations = planes.registrations();
                let ended = cut(&registrations, "the instance is drained: its drain deadline passed");
                planes.drain_gate().cut.fetch_add(ended, Ordering::AcqRel);
                tracing::info!(ended, "drain deadline: ended the streams still in flight");
            });
            if let Some(previous) = gate.cutter.lock().replace(task) {
                previous.abort();
            }
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
            if let Some(task) = gate.cutter.lock().take() {
                task.abort();
            }
            *gate.deadline.lock() = None;
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
        let gate = self.drain_gate();
        let deadline_in_s = gate.deadline.lock().map(|at| at.saturating_duration_since(Instant::now()).as_secs_f64());
        DrainStatus { state, inflight, deadline_in_s, cut: gate.cut.load(Ordering::Acquire) }
    }
}

//! Readiness: whether this process should be sent new requests now (what the system
//! server's `/ready` reports, and what a Kubernetes readiness probe or `dynamo serve`'s
//! rolling restart waits for).
//!
//! A process is ready once it has at least one endpoint registered in discovery and
//! its engine has answered, and stops being ready the moment it starts draining.
//! "Its engine has answered" is a mark the process owns: it holds it before it serves
//! when it has an engine to check, and gives it once the engine answered a first request
//! (after its endpoints are registered). A process that never touches the mark (a plain
//! SDK service, a `@dynamo_worker`) is ready as soon as an endpoint is registered; one
//! that serves no endpoint at all (an SDK service with only `@api` routes) gives the mark
//! once it serves, and is ready from then on.

use std::sync::atomic::{AtomicU8, Ordering};

/// The mark was never held nor given: registrations decide.
const UNSET: u8 = 0;
/// Held: not ready whatever else holds.
const HELD: u8 = 1;
/// Given: the process vouches that it serves (its engine answered).
const GIVEN: u8 = 2;

/// Why a process is not ready, as `/ready` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotReady {
    /// Shutdown (drain) has begun.
    Draining,
    /// No endpoint of this process is registered in discovery (yet, or any more).
    NotRegistered,
    /// The process holds its mark: its engine has not answered yet.
    EngineNotReady,
}

impl NotReady {
    /// The short status word `/ready` answers with.
    pub fn status(self) -> &'static str {
        match self {
            NotReady::Draining => "draining",
            NotReady::NotRegistered => "not_registered",
            NotReady::EngineNotReady => "engine_not_ready",
        }
    }

    /// A sentence for logs and the `/ready` body.
    pub fn reason(self) -> &'static str {
        match self {
            NotReady::Draining => "the process is draining (an operator's drain, or shutting down)",
            NotReady::NotRegistered => "no endpoint of this process is registered in discovery",
            NotReady::EngineNotReady => "the engine has not answered yet",
        }
    }
}

/// The readiness mark of a process (unset, held or given) and the rule that combines it
/// with the process's registrations and shutdown state.
#[derive(Debug)]
pub(crate) struct Readiness {
    mark: AtomicU8,
}

impl Default for Readiness {
    fn default() -> Self {
        Readiness { mark: AtomicU8::new(UNSET) }
    }
}

impl Readiness {
    /// Hold (`false`) or give (`true`) the mark.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.mark.store(if ready { GIVEN } else { HELD }, Ordering::Release);
    }

    /// The rule: draining wins; then a held mark; then a given mark, or else at least
    /// one endpoint registered.
    pub(crate) fn check(&self, draining: bool, registered: bool) -> Result<(), NotReady> {
        if draining {
            return Err(NotReady::Draining);
        }
        match self.mark.load(Ordering::Acquire) {
            HELD => Err(NotReady::EngineNotReady),
            GIVEN => Ok(()),
            _ if registered => Ok(()),
            _ => Err(NotReady::NotRegistered),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_mark_follows_registrations() {
        let r = Readiness::default();
        assert_eq!(r.check(false, false), Err(NotReady::NotRegistered));
        assert_eq!(r.check(false, true), Ok(()));
        assert_eq!(r.check(true, true), Err(NotReady::Draining));
    }

    #[test]
    fn held_mark_wins_over_registrations_until_given() {
        let r = Readiness::default();
        r.set_ready(false);
        assert_eq!(r.check(false, true), Err(NotReady::EngineNotReady));
        r.set_ready(true);
        assert_eq!(r.check(false, true), Ok(()));
        // Given: the process vouches for itself (it serves no endpoint).
        assert_eq!(r.check(false, false), Ok(()));
    }

    #[test]
    fn draining_wins_over_everything() {
        let r = Readiness::default();
        r.set_ready(true);
        assert_eq!(r.check(true, true), Err(NotReady::Draining));
        r.set_ready(false);
        assert_eq!(r.check(true, false), Err(NotReady::Draining));
    }
}

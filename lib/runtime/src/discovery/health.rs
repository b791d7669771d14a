//! What a backend knows about its connection to its store: a small board of open
//! problems (the lease, each watch, …); the backend is healthy when the board is empty.

use std::collections::BTreeMap;
use std::time::Instant;

use parking_lot::Mutex;

/// What a discovery backend knows about its connection to its store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DiscoveryHealth {
    /// Reads, writes and watches work; the lease is held.
    Healthy,
    /// The store cannot be reached or the lease is lost; cached state is being served.
    Degraded {
        /// When the oldest open problem began.
        since: std::time::Instant,
        /// What is wrong, one clause per open problem.
        reason: String,
    },
}

impl DiscoveryHealth {
    /// Whether the backend is [`DiscoveryHealth::Healthy`].
    pub fn is_healthy(&self) -> bool {
        matches!(self, DiscoveryHealth::Healthy)
    }
}

/// Who reports a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    /// The lease keeper: the store does not answer renewals, or the lease is lost.
    Lease,
    /// One prefix watch (by a per-backend sequence number).
    Watch(u64),
}

/// The open problems of one backend.
#[derive(Debug, Default)]
pub(crate) struct HealthBoard {
    problems: Mutex<BTreeMap<Source, (Instant, String)>>,
}

impl HealthBoard {
    /// Record that `source` has a problem. Returns `true` when this opens the problem
    /// (it was not open before), so callers log each transition once. An open problem
    /// keeps its start time; its reason is updated.
    pub(crate) fn report(&self, source: Source, reason: impl Into<String>) -> bool {
        let mut problems = self.problems.lock();
        match problems.get_mut(&source) {
            Some((_, old)) => {
                *old = reason.into();
                false
            }
            None => {
                problems.insert(source, (Instant::now(), reason.into()));
                true
            }
        }
    }

    /// Close the problem of `source`; returns when it had opened, if it was open.
    pub(crate) fn clear(&self, source: Source) -> Option<Instant> {
        self.problems.lock().remove(&source).map(|(since, _)| since)
    }

    /// The health these problems add up to.
    pub(crate) fn health(&self) -> DiscoveryHealth {
        let problems = self.problems.lock();
        let Some(since) = problems.values().map(|(since, _)| *since).min() else {
            return DiscoveryHealth::Healthy;
        };
        let reason = problems.values().map(|(_, r)| r.as_str()).collect::<Vec<_>>().join("; ");
        DiscoveryHealth::Degraded { since, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degraded_while_any_problem_is_open() {
        let board = HealthBoard::default();
        assert_eq!(board.health(), DiscoveryHealth::Healthy);
        assert!(board.report(Source::Watch(1), "watch a down"));
        assert!(!board.report(Source::Watch(1), "watch a still down"), "not a new transition");
        assert!(board.report(Source::Lease, "lease lost"));
        let DiscoveryHealth::Degraded { reason, .. } = board.health() else { panic!("healthy") };
        assert!(reason.contains("lease lost") && reason.contains("watch a still down"), "{reason}");
        assert!(board.clear(Source::Watch(1)).is_some());
        assert!(board.clear(Source::Watch(1)).is_none());
        assert!(!board.health().is_healthy());
        board.clear(Source::Lease);
        assert!(board.health().is_healthy());
    }
}

//! Each candidate in turn.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Pick, SelectError, Selector};

/// Picks the candidates in turn (by position among the candidates of each request).
#[derive(Debug)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    /// Starting at a random position, so that one-shot selectors (a fresh one per
    /// process) spread over the instances instead of all picking the first.
    pub fn new() -> Self {
        Self::starting_at(rand::random::<u32>() as usize)
    }

    /// Starting at position `start` (reproducible replays).
    pub fn starting_at(start: usize) -> Self {
        RoundRobin { next: AtomicUsize::new(start) }
    }
}

impl Default for RoundRobin {
    fn default() -> Self {
        Self::new()
    }
}

impl Selector for RoundRobin {
    fn select(&self, _tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError> {
        if candidates.is_empty() {
            return Err(SelectError::NoCandidates);
        }
        let index = self.next.fetch_add(1, Ordering::Relaxed) % candidates.len();
        Ok(Pick::of(candidates[index]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_candidate_in_turn() {
        let rr = RoundRobin::starting_at(0);
        let picks: Vec<u64> = (0..4).map(|_| rr.select(&[], &[7, 8, 9]).unwrap().instance).collect();
        assert_eq!(picks, vec![7, 8, 9, 7]);
        assert_eq!(rr.select(&[], &[]).unwrap_err(), SelectError::NoCandidates);
    }
}

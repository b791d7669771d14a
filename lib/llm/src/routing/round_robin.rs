//! Each candidate in turn.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{Pick, SelectError, Selector};
use crate::kv_router::ttft::{combine, Aggregate};
use crate::kv_router::InflightTracker;

/// Picks the candidates in turn (by position among the candidates of each request).
#[derive(Debug)]
pub struct RoundRobin {
    next: AtomicUsize,
    /// Requests waiting for a first item per instance, and its timing (the TTFT estimate).
    waiting: InflightTracker,
}

impl RoundRobin {
    /// Starting at a random position, so that one-shot selectors (a fresh one per
    /// process) spread over the instances instead of all picking the first.
    pub fn new() -> Self {
        Self::starting_at(rand::random::<u32>() as usize)
    }

    /// Starting at position `start` (reproducible replays).
    pub fn starting_at(start: usize) -> Self {
        RoundRobin { next: AtomicUsize::new(start), waiting: InflightTracker::default() }
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
        let instance = candidates[index];
        // One prefill unit per request: the frontend does not know the prompt's work.
        Ok(Pick { load: Some(self.waiting.start(instance).prefilling(1)), ..Pick::of(instance) })
    }

    fn ttft_estimate(&self, _tokens: &[u32], candidates: &[u64]) -> Option<Duration> {
        let (load, now) = (self.waiting.load().lock(), Instant::now());
        combine(candidates.iter().map(|w| load.ttft_estimate(*w, 1, now)), Aggregate::Mean)
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

    #[test]
    fn the_estimate_is_requests_waiting_times_the_observed_ttft() {
        let rr = RoundRobin::starting_at(0);
        let mut first = rr.select(&[], &[7]).unwrap();
        assert_eq!(rr.ttft_estimate(&[], &[7]), None, "nothing timed yet");
        std::thread::sleep(Duration::from_millis(5));
        first.load.as_mut().unwrap().observe_item();
        let alone = rr.ttft_estimate(&[], &[7]).expect("timed");
        assert!(alone >= Duration::from_millis(5), "{alone:?}");
        let second = rr.select(&[], &[7]).unwrap();
        let behind = rr.ttft_estimate(&[], &[7]).unwrap();
        assert!(behind.abs_diff(alone * 2) <= Duration::from_nanos(2), "one waiting ahead: {behind:?}");
        drop(second);
        assert_eq!(rr.ttft_estimate(&[], &[7]), Some(alone));
        assert_eq!(rr.ttft_estimate(&[], &[7, 8]), None, "an instance not timed yet");
    }
}

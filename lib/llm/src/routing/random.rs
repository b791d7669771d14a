//! A candidate at random.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Pick, SelectError, Selector};
use crate::kv_router::ttft::{combine, Aggregate};
use crate::kv_router::InflightTracker;

/// Picks a candidate uniformly at random.
#[derive(Debug, Default)]
pub struct Random {
    /// The draws of a reproducible replay; the thread's generator when `None`.
    seeded: Option<Mutex<StdRng>>,
    /// Requests waiting for a first item per instance, and its timing (the TTFT estimate).
    waiting: InflightTracker,
}

impl Random {
    /// Drawing from the thread's generator.
    pub fn new() -> Self {
        Random { seeded: None, waiting: InflightTracker::default() }
    }

    /// Drawing from a generator seeded with `seed`: the same picks every run.
    pub fn seeded(seed: u64) -> Self {
        Random { seeded: Some(Mutex::new(StdRng::seed_from_u64(seed))), waiting: InflightTracker::default() }
    }
}

impl Selector for Random {
    fn select(&self, _tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError> {
        if candidates.is_empty() {
            return Err(SelectError::NoCandidates);
        }
        let index = match &self.seeded {
            Some(rng) => rng.lock().random_range(0..candidates.len()),
            None => rand::random::<u32>() as usize % candidates.len(),
        };
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
    fn picks_among_the_candidates() {
        let random = Random::new();
        for _ in 0..20 {
            assert!([3, 4].contains(&random.select(&[], &[3, 4]).unwrap().instance));
        }
        assert_eq!(random.select(&[], &[]).unwrap_err(), SelectError::NoCandidates);
        let picks = |r: Random| (0..8).map(|_| r.select(&[], &[1, 2, 3]).unwrap().instance).collect::<Vec<_>>();
        assert_eq!(picks(Random::seeded(9)), picks(Random::seeded(9)), "same seed, same picks");
    }
}

//! A candidate at random.

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Pick, SelectError, Selector};

/// Picks a candidate uniformly at random.
#[derive(Debug, Default)]
pub struct Random {
    /// The draws of a reproducible replay; the thread's generator when `None`.
    seeded: Option<Mutex<StdRng>>,
}

impl Random {
    /// Drawing from the thread's generator.
    pub fn new() -> Self {
        Random { seeded: None }
    }

    /// Drawing from a generator seeded with `seed`: the same picks every run.
    pub fn seeded(seed: u64) -> Self {
        Random { seeded: Some(Mutex::new(StdRng::seed_from_u64(seed))) }
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
        Ok(Pick::of(candidates[index]))
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

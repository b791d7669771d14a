//! A candidate at random.

use super::{Pick, SelectError, Selector};

/// Picks a candidate uniformly at random.
#[derive(Debug, Default)]
pub struct Random;

impl Selector for Random {
    fn select(&self, _tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError> {
        if candidates.is_empty() {
            return Err(SelectError::NoCandidates);
        }
        Ok(Pick::of(candidates[rand::random::<u32>() as usize % candidates.len()]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_among_the_candidates() {
        for _ in 0..20 {
            assert!([3, 4].contains(&Random.select(&[], &[3, 4]).unwrap().instance));
        }
        assert_eq!(Random.select(&[], &[]).unwrap_err(), SelectError::NoCandidates);
    }
}

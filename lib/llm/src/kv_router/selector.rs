//! Choosing a worker from its predicted overlap and its load. For each candidate:
//!
//! `logit = overlap_weight * overlap_blocks / request_blocks - load_weight * inflight / max(1, max_inflight)`
//!
//! and the highest logit wins; ties are broken uniformly at random.

use rand::Rng;

/// Default weight of the predicted prefix overlap.
pub const DEFAULT_OVERLAP_WEIGHT: f64 = 2.0;
/// Default weight of the in-flight load.
pub const DEFAULT_LOAD_WEIGHT: f64 = 1.0;

/// One worker the selector may choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    /// The worker's instance id.
    pub worker: u64,
    /// Leading request blocks it is predicted to hold.
    pub overlap_blocks: usize,
    /// Requests the router has in flight on it.
    pub inflight: usize,
}

/// The selector's weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectorWeights {
    /// Weight of the overlap fraction.
    pub overlap_weight: f64,
    /// Weight of the normalized in-flight count.
    pub load_weight: f64,
}

impl Default for SelectorWeights {
    fn default() -> Self {
        SelectorWeights { overlap_weight: DEFAULT_OVERLAP_WEIGHT, load_weight: DEFAULT_LOAD_WEIGHT }
    }
}

/// The logit of each candidate, in order (higher is better).
pub fn logits(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights) -> Vec<f64> {
    let max_inflight = candidates.iter().map(|c| c.inflight).max().unwrap_or(0).max(1) as f64;
    candidates
        .iter()
        .map(|c| {
            let overlap = if request_blocks == 0 { 0.0 } else { c.overlap_blocks as f64 / request_blocks as f64 };
            weights.overlap_weight * overlap - weights.load_weight * (c.inflight as f64 / max_inflight)
        })
        .collect()
}

/// The candidate with the highest logit, ties broken with `rng`; `None` when there
/// are no candidates.
pub fn select(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights, rng: &mut impl Rng) -> Option<Candidate> {
    let logits = logits(candidates, request_blocks, weights);
    let best = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let tied: Vec<usize> = (0..candidates.len()).filter(|&i| logits[i] >= best).collect();
    if tied.is_empty() {
        return None;
    }
    Some(candidates[tied[rng.random_range(0..tied.len())]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(worker: u64, overlap_blocks: usize, inflight: usize) -> Candidate {
        Candidate { worker, overlap_blocks, inflight }
    }

    fn pick(candidates: &[Candidate], request_blocks: usize) -> u64 {
        select(candidates, request_blocks, SelectorWeights::default(), &mut rand::rng()).map(|c| c.worker).unwrap()
    }

    #[test]
    fn no_candidates_no_choice() {
        assert!(select(&[], 4, SelectorWeights::default(), &mut rand::rng()).is_none());
    }

    #[test]
    fn prefers_overlap() {
        assert_eq!(pick(&[c(1, 0, 0), c(2, 4, 0)], 4), 2);
        // Full overlap (+2) beats a busier worker's load penalty (-1).
        assert_eq!(pick(&[c(1, 0, 0), c(2, 4, 3)], 4), 2);
        // A little overlap does not outweigh being the busiest.
        assert_eq!(pick(&[c(1, 0, 0), c(2, 1, 3)], 4), 1);
    }

    #[test]
    fn balances_load_without_overlap() {
        assert_eq!(pick(&[c(1, 0, 2), c(2, 0, 1)], 4), 2);
        assert_eq!(pick(&[c(1, 0, 0), c(2, 0, 5), c(3, 0, 1)], 0), 1);
    }

    #[test]
    fn ties_are_broken_at_random() {
        let mut seen = [0usize; 2];
        let mut rng = rand::rng();
        for _ in 0..200 {
            let chosen = select(&[c(1, 2, 1), c(2, 2, 1)], 4, SelectorWeights::default(), &mut rng).unwrap();
            seen[(chosen.worker - 1) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0, "both workers are chosen: {seen:?}");
    }

    #[test]
    fn logits_follow_the_formula() {
        let l = logits(&[c(1, 2, 0), c(2, 0, 4)], 4, SelectorWeights::default());
        assert_eq!(l, vec![1.0, -1.0]);
    }
}

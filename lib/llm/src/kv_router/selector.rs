//! Choosing a worker from its predicted prefix overlap and its load. For each candidate:
//!
//! ```text
//! cost = slowness × (overlap_weight × (request_blocks − overlap_blocks)   prefill still to compute
//!                    + decode_blocks                                      KV blocks in use there, and queued
//!                    + request_blocks)                                    what this request will hold
//! ```
//!
//! `slowness` is 1 for a worker as fast as the fleet and its observed time per output
//! token relative to the fleet's median for a straggler (see
//! [`super::scheduler::LoadTracker`]). A straggler's cached prefix does not count (its
//! `overlap_blocks` are taken as 0): at a weight that holds cache affinity, a prefix
//! would otherwise keep its conversations on a slow worker. With `temperature` 0 the
//! cheapest worker wins (ties broken uniformly at random); above 0 a worker is drawn with probability
//! `softmax(−cost / max_cost / temperature)`, so equally good workers share a burst of
//! requests instead of all taking the same one (herding).

use rand::Rng;

/// Default weight of a prefill block against a decode block. A worker's blocks in use
/// swing by more than a cached prefix saves as its running requests change; at weight 1
/// that noise outweighed the prefix and KV routing did little better than round-robin
/// on prefix-heavy traffic (the serving benchmark and the routing lab in
/// docs/performance.md); above 8, hot prefixes pile onto their workers
/// (TTFT p99 grows). Of the weights tried (1–64), 8 had the best median TTFT.
pub const DEFAULT_OVERLAP_WEIGHT: f64 = 8.0;
/// Default softmax temperature (0: always the cheapest).
pub const DEFAULT_TEMPERATURE: f64 = 0.0;

/// One worker the selector may choose.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// The worker's instance id.
    pub worker: u64,
    /// Leading request blocks it is predicted to hold.
    pub overlap_blocks: usize,
    /// KV blocks predicted in use on it (its load metrics plus what was sent since, or
    /// the router's own count of the blocks of its requests in flight).
    pub decode_blocks: f64,
    /// Cost multiplier, at least 1: how much slower than the fleet it is.
    pub slowness: f64,
}

impl Candidate {
    /// A worker of normal speed.
    pub fn new(worker: u64, overlap_blocks: usize, decode_blocks: f64) -> Self {
        Candidate { worker, overlap_blocks, decode_blocks, slowness: 1.0 }
    }
}

/// The selector's settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SelectorWeights {
    /// Weight of a block to prefill against a block in use (decode load); ≥ 0.
    pub overlap_weight: f64,
    /// Softmax temperature over the normalised negative cost; 0 is argmin; ≥ 0.
    pub temperature: f64,
}

impl Default for SelectorWeights {
    fn default() -> Self {
        SelectorWeights { overlap_weight: DEFAULT_OVERLAP_WEIGHT, temperature: DEFAULT_TEMPERATURE }
    }
}

impl SelectorWeights {
    /// Check the ranges.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.overlap_weight.is_finite() && self.overlap_weight >= 0.0) {
            return Err(format!("overlap weight must be a finite number >= 0, got {}", self.overlap_weight));
        }
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!("router temperature must be a finite number >= 0, got {}", self.temperature));
        }
        Ok(())
    }
}

/// The cost of each candidate, in order (lower is better).
pub fn costs(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights) -> Vec<f64> {
    candidates
        .iter()
        .map(|c| {
            let overlap = if c.slowness > 1.0 { 0 } else { c.overlap_blocks };
            let prefill = request_blocks.saturating_sub(overlap) as f64;
            let work = weights.overlap_weight * prefill + c.decode_blocks.max(0.0) + request_blocks as f64;
            c.slowness.max(1.0) * work
        })
        .collect()
}

/// The probability of choosing each candidate (sums to 1; all mass on the cheapest,
/// shared equally among ties, at temperature 0).
pub fn probabilities(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights) -> Vec<f64> {
    let costs = costs(candidates, request_blocks, weights);
    if costs.is_empty() {
        return Vec::new();
    }
    let min = costs.iter().copied().fold(f64::INFINITY, f64::min);
    if weights.temperature <= 0.0 {
        let tied = costs.iter().filter(|&&c| c <= min).count() as f64;
        return costs.iter().map(|&c| if c <= min { 1.0 / tied } else { 0.0 }).collect();
    }
    let max = costs.iter().copied().fold(0.0, f64::max);
    let scale = if max > 0.0 { max } else { 1.0 };
    // Shift by the minimum so the largest weight is exp(0) = 1.
    let w: Vec<f64> = costs.iter().map(|&c| (-(c - min) / scale / weights.temperature).exp()).collect();
    let total: f64 = w.iter().sum();
    w.iter().map(|x| x / total).collect()
}

/// Draw a candidate (see the module docs); `None` when there are none.
pub fn select(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights, rng: &mut impl Rng) -> Option<Candidate> {
    let p = probabilities(candidates, request_blocks, weights);
    if p.is_empty() {
        return None;
    }
    let mut x: f64 = rng.random_range(0.0..1.0);
    for (i, pi) in p.iter().enumerate() {
        if x < *pi {
            return Some(candidates[i]);
        }
        x -= pi;
    }
    // Rounding: the last candidate with any probability.
    p.iter().rposition(|&pi| pi > 0.0).map(|i| candidates[i])
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn c(worker: u64, overlap_blocks: usize, decode_blocks: f64) -> Candidate {
        Candidate::new(worker, overlap_blocks, decode_blocks)
    }

    /// Weight 1 keeps the arithmetic of the tests plain.
    const W1: SelectorWeights = SelectorWeights { overlap_weight: 1.0, temperature: 0.0 };

    fn pick_with(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights) -> u64 {
        select(candidates, request_blocks, weights, &mut rand::rng()).map(|c| c.worker).unwrap()
    }

    fn pick(candidates: &[Candidate], request_blocks: usize) -> u64 {
        pick_with(candidates, request_blocks, W1)
    }

    fn counts(candidates: &[Candidate], request_blocks: usize, weights: SelectorWeights, n: usize) -> Vec<usize> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut seen = vec![0; candidates.len()];
        for _ in 0..n {
            let chosen = select(candidates, request_blocks, weights, &mut rng).unwrap();
            seen[candidates.iter().position(|c| c.worker == chosen.worker).unwrap()] += 1;
        }
        seen
    }

    #[test]
    fn no_candidates_no_choice() {
        assert!(select(&[], 4, SelectorWeights::default(), &mut rand::rng()).is_none());
    }

    #[test]
    fn costs_follow_the_formula() {
        let w = SelectorWeights { overlap_weight: 2.0, temperature: 0.0 };
        let slow = Candidate { slowness: 3.0, ..c(3, 4, 0.0) };
        // 2×(4−1) + 10 + 4 = 20; 2×0 + 0 + 4 = 4; 3 × (2×4 + 0 + 4) = 36 (a straggler's
        // cached blocks do not count).
        assert_eq!(costs(&[c(1, 1, 10.0), c(2, 4, 0.0), slow], 4, w), vec![20.0, 4.0, 36.0]);
    }

    #[test]
    fn prefers_overlap_until_load_outweighs_it() {
        assert_eq!(pick(&[c(1, 0, 0.0), c(2, 4, 0.0)], 4), 2);
        // 4 cached blocks save 4 blocks of prefill: worth 3 more blocks of decode load...
        assert_eq!(pick(&[c(1, 0, 0.0), c(2, 4, 3.0)], 4), 2);
        // ...not 5.
        assert_eq!(pick(&[c(1, 0, 0.0), c(2, 4, 5.0)], 4), 1);
        // At the default weight (8) they are worth 31 blocks, not 33.
        let default = SelectorWeights::default();
        assert_eq!(pick_with(&[c(1, 0, 0.0), c(2, 4, 31.0)], 4, default), 2);
        assert_eq!(pick_with(&[c(1, 0, 0.0), c(2, 4, 33.0)], 4, default), 1);
    }

    #[test]
    fn temperature_zero_is_deterministic_argmin() {
        let cands = [c(1, 0, 8.0), c(2, 2, 8.0), c(3, 0, 1.0)];
        // Costs: 4+8+4=16, 2+8+4=14, 4+1+4=9.
        for _ in 0..50 {
            assert_eq!(pick(&cands, 4), 3);
        }
        assert_eq!(probabilities(&cands, 4, W1), vec![0.0, 0.0, 1.0]);
    }

    #[test]
    fn ties_are_broken_at_random() {
        let seen = counts(&[c(1, 2, 1.0), c(2, 2, 1.0)], 4, W1, 400);
        assert!(seen[0] > 100 && seen[1] > 100, "both workers are chosen: {seen:?}");
    }

    #[test]
    fn temperature_spreads_a_burst_over_near_equal_workers() {
        // Worker 1 is a little better; at temperature 0 it takes everything.
        let cands = [c(1, 0, 0.0), c(2, 0, 1.0), c(3, 0, 1.0), c(4, 0, 50.0)];
        let cold = counts(&cands, 8, W1, 600);
        assert_eq!(cold, vec![600, 0, 0, 0]);
        let warm = counts(&cands, 8, SelectorWeights { temperature: 0.5, ..W1 }, 600);
        assert!(warm[1] > 100 && warm[2] > 100, "near-equal workers share the burst: {warm:?}");
        assert!(warm[3] < warm[1] / 2, "a much busier worker gets little: {warm:?}");
        let p = probabilities(&cands, 8, SelectorWeights { temperature: 0.5, ..W1 });
        assert!(p[0] > p[1] && p[1] == p[2] && p[2] > p[3], "cheaper is likelier: {p:?}");
        assert!((p.iter().sum::<f64>() - 1.0).abs() < 1e-9);
    }

    #[test]
    fn a_slow_worker_loses_its_affinity() {
        // Worker 1 holds the whole prefix but is 4× slower than the fleet: at the default
        // weight, a prefix worth 64 blocks of prefill does not keep the request there.
        let default = SelectorWeights::default();
        let slow = Candidate { slowness: 4.0, ..c(1, 8, 2.0) };
        assert_eq!(pick_with(&[slow, c(2, 0, 2.0)], 8, default), 2);
        // At normal speed the prefix wins.
        assert_eq!(pick_with(&[c(1, 8, 2.0), c(2, 0, 2.0)], 8, default), 1);
        // A straggler still takes work when the fleet is 4× as loaded.
        let slow_idle = Candidate { slowness: 4.0, ..c(1, 8, 0.0) };
        assert_eq!(pick_with(&[slow_idle, c(2, 0, 300.0)], 8, default), 1);
    }

    #[test]
    fn weights_are_validated() {
        assert!(SelectorWeights::default().validate().is_ok());
        assert!(SelectorWeights { overlap_weight: -1.0, ..Default::default() }.validate().is_err());
        assert!(SelectorWeights { temperature: f64::NAN, ..Default::default() }.validate().is_err());
    }
}

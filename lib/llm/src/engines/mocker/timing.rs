//! How long a simulated step takes (the formula is documented on
//! [`crate::engines::mocker::MockerArgs`]).

use std::time::Duration;

use super::args::MockerArgs;

/// The work of one step.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct StepWork {
    /// `(new tokens, tokens before them)` of each prefill chunk.
    pub(crate) prefill_chunks: Vec<(usize, usize)>,
    /// Sequences decoding one token.
    pub(crate) decoding_seqs: usize,
    /// Blocks in use during the step.
    pub(crate) active_blocks: usize,
}

/// Simulated milliseconds of `work` at speedup 1.
pub(crate) fn step_ms(args: &MockerArgs, work: &StepWork) -> f64 {
    let prefill: f64 = work
        .prefill_chunks
        .iter()
        .map(|&(new, cached)| {
            let (new, context) = (new as f64, (cached + new) as f64);
            args.prefill_ms_per_token * new + args.prefill_ms_per_token_squared * context * new
        })
        .sum();
    let decode = if work.decoding_seqs > 0 {
        args.decode_base_ms
            + args.decode_ms_per_seq * work.decoding_seqs as f64
            + args.decode_ms_per_block * work.active_blocks as f64
    } else {
        0.0
    };
    prefill + decode
}

/// Wall-clock time of `work`: simulated time divided by `speedup_ratio`.
pub(crate) fn step_duration(args: &MockerArgs, work: &StepWork) -> Duration {
    Duration::from_secs_f64(step_ms(args, work) / 1000.0 / args.speedup_ratio)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_give_plausible_times() {
        let args = MockerArgs::default();
        let prefill = step_ms(&args, &StepWork { prefill_chunks: vec![(1000, 0)], ..Default::default() });
        assert!((10.0..100.0).contains(&prefill), "{prefill}");
        let decode = step_ms(&args, &StepWork { decoding_seqs: 4, active_blocks: 100, ..Default::default() });
        assert!((5.0..=10.0).contains(&decode), "{decode}");
        assert_eq!(step_ms(&args, &StepWork::default()), 0.0);
    }

    #[test]
    fn cached_prefix_makes_prefill_cheaper_than_recomputing_it() {
        let args = MockerArgs::default();
        let cold = step_ms(&args, &StepWork { prefill_chunks: vec![(1000, 0)], ..Default::default() });
        let warm = step_ms(&args, &StepWork { prefill_chunks: vec![(200, 800)], ..Default::default() });
        assert!(warm < cold / 2.0, "{warm} vs {cold}");
        let fast = MockerArgs { speedup_ratio: 10.0, ..MockerArgs::default() };
        let work = StepWork { prefill_chunks: vec![(1000, 0)], ..Default::default() };
        let ratio = step_duration(&args, &work).as_secs_f64() / step_duration(&fast, &work).as_secs_f64();
        assert!((ratio - 10.0).abs() < 1e-6, "{ratio}");
    }
}

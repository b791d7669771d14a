//! One request inside the simulated engine: its tokens (prompt + generated), the hashes
//! of its full blocks, the KV blocks it holds and how much of it has been computed.

use tokio::sync::mpsc;

use crate::kv_router::protocols::{next_block_hash, BlockHash};
use crate::engine::EngineError;
use crate::protocols::common::LLMEngineOutput;

/// Where a sequence's output items go.
pub(crate) type OutputSender = mpsc::UnboundedSender<Result<LLMEngineOutput, EngineError>>;


/// A block a sequence holds in the KV manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeldBlock {
    /// A full, computed, shareable block.
    Full(u64),
    /// A block only this sequence uses (partial or not computed yet).
    Private,
}

/// A request being served.
#[derive(Debug)]
pub(crate) struct Sequence {
    /// The engine's id of the request.
    pub(crate) id: u64,
    tokens: Vec<u32>,
    block_size: usize,
    hashes: Vec<BlockHash>,
    /// Blocks held, in token order.
    pub(crate) held: Vec<HeldBlock>,
    /// Tokens whose KV has been computed.
    pub(crate) computed: usize,
    /// Prompt tokens found cached when the sequence was first admitted (reported on its
    /// last output, as vLLM reports `num_cached_tokens`).
    pub(crate) cached_tokens: Option<u32>,
    generated: usize,
    max_tokens: usize,
    seed: u64,
    /// Receives the generated tokens.
    pub(crate) output: OutputSender,
}

impl Sequence {
    /// A sequence for `prompt` that will generate `max_tokens` tokens from `seed`.
    pub(crate) fn new(id: u64, prompt: Vec<u32>, block_size: usize, max_tokens: usize, seed: u64, output: OutputSender) -> Self {
        let mut seq = Sequence {
            id,
            tokens: Vec::with_capacity(prompt.len() + max_tokens),
            block_size,
            hashes: Vec::new(),
            held: Vec::new(),
            computed: 0,
            cached_tokens: None,
            generated: 0,
            max_tokens,
            seed,
            output,
        };
        for t in prompt {
            seq.push(t);
        }
        seq
    }

    /// Tokens so far (prompt + generated).
    pub(crate) fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Hashes of the full blocks so far.
    pub(crate) fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    /// Tokens generated so far.
    pub(crate) fn generated(&self) -> usize {
        self.generated
    }

    /// Whether `max_tokens` were generated.
    pub(crate) fn is_done(&self) -> bool {
        self.generated >= self.max_tokens
    }

    /// Tokens still to compute before the next token can be sampled.
    pub(crate) fn uncomputed(&self) -> usize {
        self.tokens.len() - self.computed
    }

    /// Blocks needed to hold the KV of `tokens` tokens.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// Sample and append the next token: one of the tokens so far, picked by a hash of
    /// the seed and the position. The choice depends only on (seed, tokens so far,
    /// position), so a migrated continuation (the prompt plus the tokens generated so far,
    /// same seed) goes on exactly as the lost stream would have. The prompt is never
    /// empty (the engine refuses that).
    pub(crate) fn sample(&mut self) -> u32 {
        let position = self.tokens.len() as u64;
        let mut state = self.seed ^ position.wrapping_mul(0xD6E8_FEB8_6659_FD93);
        let pick = (splitmix64(&mut state) % position.max(1)) as usize;
        let token = self.tokens.get(pick).copied().unwrap_or(0);
        self.push(token);
        self.generated += 1;
        token
    }

    fn push(&mut self, token: u32) {
        self.tokens.push(token);
        if self.tokens.len().is_multiple_of(self.block_size) {
            let start = self.tokens.len() - self.block_size;
            let parent = self.hashes.last().map(|h| h.block_hash);
            self.hashes.push(next_block_hash(parent, &self.tokens[start..]));
        }
    }
}

/// SplitMix64: a tiny, good-enough generator for token ids.
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_router::protocols::hash_full_blocks;

    fn seq(prompt: Vec<u32>, seed: u64) -> Sequence {
        Sequence::new(1, prompt, 4, 10, seed, mpsc::unbounded_channel().0)
    }

    #[test]
    fn generated_tokens_fill_and_hash_blocks() {
        let mut s = seq((0..6).collect(), 7);
        assert_eq!(s.hashes().len(), 1, "the partial block has no hash");
        let a = s.sample();
        assert!((0..6).contains(&a), "the first generated token comes from the prompt");
        assert_eq!(s.hashes().len(), 1);
        let b = s.sample();
        assert_eq!(s.hashes().len(), 2, "the block filled during decode is hashed");
        assert_eq!(s.hashes(), hash_full_blocks(&[0, 1, 2, 3, 4, 5, a, b], 4).as_slice());
        assert_eq!(s.generated(), 2);
        assert_eq!(s.blocks_for(s.len()), 2);
        assert_eq!(s.blocks_for(9), 3);
    }

    #[test]
    fn sampling_is_deterministic_per_seed() {
        let (mut a, mut b, mut c) = (seq((0..50).collect(), 3), seq((0..50).collect(), 3), seq((0..50).collect(), 4));
        let ta: Vec<u32> = (0..8).map(|_| a.sample()).collect();
        let tb: Vec<u32> = (0..8).map(|_| b.sample()).collect();
        let tc: Vec<u32> = (0..8).map(|_| c.sample()).collect();
        assert_eq!(ta, tb);
        assert_ne!(ta, tc);
    }

    #[test]
    fn a_continuation_goes_on_as_the_lost_stream_would_have() {
        let prompt: Vec<u32> = (0..20).collect();
        let mut whole = seq(prompt.clone(), 11);
        let all: Vec<u32> = (0..10).map(|_| whole.sample()).collect();
        let mut resumed = seq([prompt, all[..4].to_vec()].concat(), 11);
        let rest: Vec<u32> = (0..6).map(|_| resumed.sample()).collect();
        assert_eq!(rest, all[4..]);
    }
}

//! Block identities. A full block of tokens has a `tokens_hash` (the router's
//! `LocalBlockHash`: xxh3-64, seed 1337, over the token ids as little-endian u32) and a
//! `block_hash` chained from its parent's, which names the block in the prefix cache:
//! two prompts share a block only if they share everything before it too.

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Seed of every mocker hash (the reference's router uses the same for `tokens_hash`).
pub const HASH_SEED: u64 = 1337;

/// The two hashes of one full block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct BlockHash {
    /// Identity in the cache: chained over the whole prefix up to this block.
    pub block_hash: u64,
    /// Hash of this block's tokens alone.
    pub tokens_hash: u64,
}

/// xxh3-64 (seed 1337) of `tokens` as little-endian u32 bytes.
pub fn compute_tokens_hash(tokens: &[u32]) -> u64 {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    xxh3_64_with_seed(&bytes, HASH_SEED)
}

/// The chained hash of a block: its tokens hash for the first block, else xxh3-64 of
/// the parent's block hash and this block's tokens hash (16 little-endian bytes).
pub fn chain_hash(parent: Option<u64>, tokens_hash: u64) -> u64 {
    match parent {
        None => tokens_hash,
        Some(parent) => {
            let mut bytes = [0u8; 16];
            bytes[..8].copy_from_slice(&parent.to_le_bytes());
            bytes[8..].copy_from_slice(&tokens_hash.to_le_bytes());
            xxh3_64_with_seed(&bytes, HASH_SEED)
        }
    }
}

/// The hash of the block following `parent` with these (exactly `block_size`) tokens.
pub fn next_block_hash(parent: Option<u64>, tokens: &[u32]) -> BlockHash {
    let tokens_hash = compute_tokens_hash(tokens);
    BlockHash { block_hash: chain_hash(parent, tokens_hash), tokens_hash }
}

/// Hashes of every full block of `tokens`; a partial last block gets none.
pub fn hash_full_blocks(tokens: &[u32], block_size: usize) -> Vec<BlockHash> {
    let mut parent = None;
    tokens
        .chunks_exact(block_size)
        .map(|chunk| {
            let hash = next_block_hash(parent, chunk);
            parent = Some(hash.block_hash);
            hash
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_hash_is_xxh3_1337_over_le_u32() {
        let tokens = [1u32, 2, 3, 0x01020304];
        let mut bytes = Vec::new();
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        assert_eq!(compute_tokens_hash(&tokens), xxh3_64_with_seed(&bytes, 1337));
        assert_ne!(compute_tokens_hash(&tokens), xxh3_64_with_seed(&bytes, 0));
    }

    #[test]
    fn same_tokens_same_hashes() {
        let tokens: Vec<u32> = (0..64).collect();
        assert_eq!(hash_full_blocks(&tokens, 16), hash_full_blocks(&tokens, 16));
        let hashes = hash_full_blocks(&tokens, 16);
        assert_eq!(hashes.len(), 4);
        assert_eq!(hashes[0].block_hash, hashes[0].tokens_hash);
    }

    #[test]
    fn chained_hash_depends_on_the_parent() {
        let a: Vec<u32> = (0..32).collect();
        let mut b = a.clone();
        b[0] = 999; // first block differs, second block's tokens are equal
        let (ha, hb) = (hash_full_blocks(&a, 16), hash_full_blocks(&b, 16));
        assert_eq!(ha[1].tokens_hash, hb[1].tokens_hash);
        assert_ne!(ha[1].block_hash, hb[1].block_hash);
        assert_ne!(chain_hash(Some(1), 7), chain_hash(Some(2), 7));
        assert_ne!(chain_hash(None, 7), chain_hash(Some(0), 7));
    }

    #[test]
    fn partial_block_is_not_hashed() {
        let tokens: Vec<u32> = (0..40).collect();
        let hashes = hash_full_blocks(&tokens, 16);
        assert_eq!(hashes.len(), 2);
        assert_eq!(hashes, hash_full_blocks(&tokens[..32], 16));
        assert!(hash_full_blocks(&tokens[..15], 16).is_empty());
    }
}

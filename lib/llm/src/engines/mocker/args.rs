//! The mocker's configuration: cache geometry, scheduler limits and the timing model's
//! constants. Read from the JSON object of dynamo-run's `--extra-engine-args` file;
//! every key is optional and unknown keys are rejected.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Why a mocker configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    /// The file could not be read.
    #[error("cannot read mocker args file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The JSON is malformed, has an unknown key or a value of the wrong type.
    #[error("invalid mocker args: {0}")]
    Parse(#[from] serde_json::Error),
    /// A value is out of range.
    #[error("invalid mocker args: {0}")]
    Invalid(String),
}

/// Configuration of a [`crate::engines::mocker::MockerEngine`].
///
/// Simulated step time (milliseconds, before dividing by `speedup_ratio`):
///
/// ```text
/// step = Σ_prefill_chunks (prefill_ms_per_token · new + prefill_ms_per_token_squared · (cached + new) · new)
///      + [any sequence decoding] (decode_base_ms + decode_ms_per_seq · decoding_seqs
///                                 + decode_ms_per_block · active_blocks)
/// ```
///
/// where `new` is the chunk's uncomputed tokens and `cached` the tokens before the
/// chunk (prefix-cache hits and earlier chunks): attention over the context makes
/// prefill quadratic. With the defaults, an uncached 1,000-token prompt costs 30 ms
/// and a decode step of a few short sequences about 5–6 ms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MockerArgs {
    /// Tokens per KV block.
    pub block_size: usize,
    /// Capacity of the simulated KV cache, in blocks.
    pub num_gpu_blocks: usize,
    /// Most sequences running at once.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (a prefill chunk counts its new tokens, a
    /// decoding sequence counts 1).
    pub max_num_batched_tokens: usize,
    /// Fraction of the blocks kept free when admitting a new sequence.
    pub watermark: f64,
    /// Share full blocks between sequences and keep them cached after use.
    pub enable_prefix_caching: bool,
    /// Split prompts longer than the step's token budget across steps.
    pub enable_chunked_prefill: bool,
    /// Divides every simulated time (10 runs ten times faster than real time).
    pub speedup_ratio: f64,
    /// Prefill cost per new token (ms).
    pub prefill_ms_per_token: f64,
    /// Prefill attention cost per (context token × new token) (ms).
    pub prefill_ms_per_token_squared: f64,
    /// Fixed cost of a step that decodes (ms).
    pub decode_base_ms: f64,
    /// Decode cost per decoding sequence (ms).
    pub decode_ms_per_seq: f64,
    /// Decode cost per active KV block (ms): reading the cache.
    pub decode_ms_per_block: f64,
    /// Seed of the generated token ids.
    pub seed: u64,
    /// Data-parallel rank reported in the load metrics.
    pub data_parallel_rank: Option<u32>,
    /// KV cache bytes per token (a disaggregated handoff moves `block_size` times this
    /// per block). The default is Llama-3-8B's in fp16: 32 layers · 2 · 8 heads · 128 · 2 B.
    pub kv_bytes_per_token: u64,
    /// Bandwidth of a KV handoff between workers, in GB/s (10⁹ bytes per second).
    pub kv_transfer_gbps: f64,
}

impl Default for MockerArgs {
    fn default() -> Self {
        MockerArgs {
            block_size: 16,
            num_gpu_blocks: 16384,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            watermark: 0.01,
            enable_prefix_caching: true,
            enable_chunked_prefill: true,
            speedup_ratio: 1.0,
            prefill_ms_per_token: 0.02,
            prefill_ms_per_token_squared: 0.00001,
            decode_base_ms: 5.0,
            decode_ms_per_seq: 0.05,
            decode_ms_per_block: 0.001,
            seed: 0,
            data_parallel_rank: None,
            kv_bytes_per_token: 131_072,
            kv_transfer_gbps: 25.0,
        }
    }
}

impl MockerArgs {
    /// Parse and validate a JSON object (missing keys take their defaults).
    pub fn from_json(json: &str) -> Result<Self, ArgsError> {
        let args: MockerArgs = serde_json::from_str(json)?;
        args.validate()?;
        Ok(args)
    }

    /// Read, parse and validate a JSON file (dynamo-run's `--extra-engine-args`).
    pub fn from_path(path: &Path) -> Result<Self, ArgsError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ArgsError::Read { path: path.display().to_string(), source })?;
        Self::from_json(&text)
    }

    /// Check that every value is in range.
    pub fn validate(&self) -> Result<(), ArgsError> {
        let positive = [
            ("block_size", self.block_size),
            ("num_gpu_blocks", self.num_gpu_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
        ];
        for (name, value) in positive {
            if value == 0 {
                return Err(ArgsError::Invalid(format!("{name} must be at least 1")));
            }
        }
        if !(0.0..1.0).contains(&self.watermark) {
            return Err(ArgsError::Invalid(format!("watermark must be in [0, 1), got {}", self.watermark)));
        }
        if !(self.speedup_ratio.is_finite() && self.speedup_ratio > 0.0) {
            return Err(ArgsError::Invalid(format!("speedup_ratio must be > 0, got {}", self.speedup_ratio)));
        }
        let times = [
            ("prefill_ms_per_token", self.prefill_ms_per_token),
            ("prefill_ms_per_token_squared", self.prefill_ms_per_token_squared),
            ("decode_base_ms", self.decode_base_ms),
            ("decode_ms_per_seq", self.decode_ms_per_seq),
            ("decode_ms_per_block", self.decode_ms_per_block),
        ];
        for (name, value) in times {
            if !(value.is_finite() && value >= 0.0) {
                return Err(ArgsError::Invalid(format!("{name} must be >= 0, got {value}")));
            }
        }
        if !(self.kv_transfer_gbps.is_finite() && self.kv_transfer_gbps > 0.0) {
            return Err(ArgsError::Invalid(format!("kv_transfer_gbps must be > 0, got {}", self.kv_transfer_gbps)));
        }
        Ok(())
    }

    /// Simulated time of moving `blocks` KV blocks between workers (already divided by
    /// `speedup_ratio`).
    pub fn transfer_duration(&self, blocks: usize) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.transfer_seconds(blocks) / self.speedup_ratio)
    }

    /// Seconds of moving `blocks` KV blocks between workers at `kv_transfer_gbps`, on the
    /// engine's own clock (`speedup_ratio` not applied: a discrete-event simulation's time).
    pub fn transfer_seconds(&self, blocks: usize) -> f64 {
        let bytes = blocks as f64 * self.block_size as f64 * self.kv_bytes_per_token as f64;
        bytes / (self.kv_transfer_gbps * 1e9)
    }

    /// Blocks kept free when admitting a new sequence.
    pub fn watermark_blocks(&self) -> usize {
        (self.watermark * self.num_gpu_blocks as f64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_partial_json() {
        let args = MockerArgs::from_json("{}").unwrap();
        assert_eq!(args, MockerArgs::default());
        assert_eq!(args.block_size, 16);
        assert_eq!(args.num_gpu_blocks, 16384);
        assert_eq!(args.watermark_blocks(), 163);
        let args = MockerArgs::from_json(r#"{"block_size": 64, "speedup_ratio": 10}"#).unwrap();
        assert_eq!(args.block_size, 64);
        assert_eq!(args.speedup_ratio, 10.0);
        assert_eq!(args.max_num_seqs, 256);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_rejected() {
        let err = MockerArgs::from_json(r#"{"blok_size": 16}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `blok_size`"), "{err}");
        let err = MockerArgs::from_json(r#"{"block_size": "16"}"#).unwrap_err();
        assert!(matches!(err, ArgsError::Parse(_)), "{err}");
        let err = MockerArgs::from_json(r#"{"block_size": 0}"#).unwrap_err();
        assert!(err.to_string().contains("block_size"), "{err}");
        assert!(MockerArgs::from_json(r#"{"watermark": 1.0}"#).is_err());
        assert!(MockerArgs::from_json(r#"{"speedup_ratio": 0}"#).is_err());
        assert!(MockerArgs::from_json(r#"{"decode_base_ms": -1}"#).is_err());
        assert!(MockerArgs::from_json(r#"{"kv_transfer_gbps": 0}"#).is_err());
    }

    #[test]
    fn transfer_time_follows_blocks_and_bandwidth() {
        // 16 tokens · 131072 B = 2 MiB a block; 100 blocks at 25 GB/s ≈ 8.4 ms.
        let args = MockerArgs::default();
        let ms = args.transfer_duration(100).as_secs_f64() * 1e3;
        assert!((ms - 8.388_608).abs() < 1e-6, "{ms}");
        let fast = MockerArgs { kv_transfer_gbps: 50.0, speedup_ratio: 2.0, ..Default::default() };
        assert!((fast.transfer_duration(100).as_secs_f64() * 1e3 - ms / 4.0).abs() < 1e-6);
    }

    #[test]
    fn from_path_reports_the_file() {
        let err = MockerArgs::from_path(Path::new("/nonexistent/mocker.json")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/mocker.json"), "{err}");
    }
}

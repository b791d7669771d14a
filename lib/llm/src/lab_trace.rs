//! What the simulation labs share: a request trace in the Mooncake format, read from JSON
//! lines and turned into token ids, the lab workers' engine settings, and the labs' error.
//! The routing lab ([`crate::routing_lab`]) replays a trace through a fixed fleet; the
//! planner lab ([`crate::planner_lab`]) steps one through a fleet that grows and shrinks.
//!
//! The trace is one JSON object per line:
//! `{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`
//! where each hash id stands for one block of `trace_block_size` prompt tokens (equal
//! ids, equal content). Each id becomes a deterministic run of token ids, so equal ids
//! give equal blocks whatever the engine's block size; tokens past the last id are
//! unique to the request.

use std::io::BufRead;
use std::path::Path;

use serde::Deserialize;

use crate::engines::mocker::{ArgsError, MockerArgs};

/// Default tokens per trace block (the Mooncake traces' 512).
pub const DEFAULT_TRACE_BLOCK_SIZE: usize = 512;

/// Default KV cache of a lab worker, in blocks of the engine's 16 tokens: one 80 GB GPU
/// serving the model the mocker's timing model and `kv_bytes_per_token` (128 KiB)
/// describe, Llama-3-8B in fp16: 16 GB of weights and ~12 GB of activations and
/// headroom leave 52 GiB, 416 Ki tokens. (The mocker's own default, 16,384 blocks,
/// is 262 Ki tokens: about twenty of a long-context trace's prompts.)
pub const DEFAULT_LAB_GPU_BLOCKS: usize = 26_624;

/// The engine settings of a lab worker: the mocker's (JSON keys as in
/// `--extra-engine-args`, `None` for none), with the lab's cache size
/// [`DEFAULT_LAB_GPU_BLOCKS`] unless `num_gpu_blocks` is given.
pub fn lab_engine_args(json: Option<&str>) -> Result<MockerArgs, ArgsError> {
    let mut settings: serde_json::Map<String, serde_json::Value> = match json {
        Some(json) => serde_json::from_str(json)?,
        None => serde_json::Map::new(),
    };
    settings.entry("num_gpu_blocks").or_insert(DEFAULT_LAB_GPU_BLOCKS.into());
    let args: MockerArgs = serde_json::from_value(serde_json::Value::Object(settings))?;
    args.validate()?;
    Ok(args)
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct TraceRequest {
    /// Arrival, in milliseconds from the start of the trace.
    pub timestamp: f64,
    /// Prompt tokens.
    pub input_length: usize,
    /// Tokens to generate.
    pub output_length: usize,
    /// The prompt's blocks, one id per `trace_block_size` tokens.
    #[serde(default)]
    pub hash_ids: Vec<u64>,
}

/// Why the lab could not run.
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    /// The trace could not be read.
    #[error("cannot read trace {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A line of the trace is not a request.
    #[error("trace line {line}: {message}")]
    Parse {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A setting is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// Read a trace file (JSON lines; blank lines are skipped).
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, LabError> {
    let read_err = |source| LabError::Read { path: path.display().to_string(), source };
    let file = std::fs::File::open(path).map_err(read_err)?;
    let mut requests = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(read_err)?;
        if line.trim().is_empty() {
            continue;
        }
        let request: TraceRequest =
            serde_json::from_str(&line).map_err(|e| LabError::Parse { line: i + 1, message: e.to_string() })?;
        if !(request.timestamp.is_finite() && request.timestamp >= 0.0) {
            return Err(LabError::Parse { line: i + 1, message: format!("bad timestamp {}", request.timestamp) });
        }
        requests.push(request);
    }
    Ok(requests)
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Token ids in a 32,000-word vocabulary.
fn token(seed: u64, i: usize) -> u32 {
    (splitmix64(seed ^ (i as u64).wrapping_mul(0xD6E8_FEB8_6659_FD93)) % 32_000) as u32 + 100
}

/// The prompt of `request` (the `index`-th of its trace): each hash id's block, then
/// tokens unique to the request up to `input_length`.
pub fn synthesize_tokens(request: &TraceRequest, index: usize, trace_block_size: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(request.input_length);
    for &id in &request.hash_ids {
        let n = trace_block_size.min(request.input_length - tokens.len());
        let seed = splitmix64(id);
        tokens.extend((0..n).map(|i| token(seed, i)));
        if tokens.len() == request.input_length {
            return tokens;
        }
    }
    let seed = splitmix64(!(index as u64));
    let start = tokens.len();
    tokens.extend((start..request.input_length).map(|i| token(seed, i)));
    tokens
}

/// The `q` quantile of ascending `sorted` (nearest rank; NaN when empty).
pub(crate) fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_hash_ids_give_equal_tokens() {
        let a = TraceRequest { timestamp: 0.0, input_length: 100, output_length: 1, hash_ids: vec![5, 6] };
        let b = TraceRequest { timestamp: 0.0, input_length: 130, output_length: 1, hash_ids: vec![5, 7] };
        let (ta, tb) = (synthesize_tokens(&a, 0, 64), synthesize_tokens(&b, 1, 64));
        assert_eq!((ta.len(), tb.len()), (100, 130));
        assert_eq!(ta[..64], tb[..64]);
        assert_ne!(ta[64..100], tb[64..100]);
        // Past the hash ids, tokens are the request's own.
        let c = TraceRequest { timestamp: 0.0, input_length: 100, output_length: 1, hash_ids: vec![5] };
        let (t0, t1) = (synthesize_tokens(&c, 0, 64), synthesize_tokens(&c, 1, 64));
        assert_eq!(t0[..64], t1[..64]);
        assert_ne!(t0[64..], t1[64..]);
    }

    #[test]
    fn lab_workers_default_to_a_gpu_sized_cache() {
        let expected = MockerArgs { num_gpu_blocks: DEFAULT_LAB_GPU_BLOCKS, ..MockerArgs::default() };
        assert_eq!(lab_engine_args(None).unwrap(), expected);
        let args = lab_engine_args(Some(r#"{"block_size": 32}"#)).unwrap();
        assert_eq!((args.block_size, args.num_gpu_blocks), (32, DEFAULT_LAB_GPU_BLOCKS));
        assert_eq!(lab_engine_args(Some(r#"{"num_gpu_blocks": 1000}"#)).unwrap().num_gpu_blocks, 1000);
        assert!(lab_engine_args(Some(r#"{"num_gpu_block": 1}"#)).unwrap_err().to_string().contains("num_gpu_block"));
        assert!(lab_engine_args(Some("[1]")).is_err());
        assert!(lab_engine_args(Some(r#"{"num_gpu_blocks": 0}"#)).is_err());
    }
}

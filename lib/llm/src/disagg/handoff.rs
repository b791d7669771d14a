//! What travels between a decode and a prefill worker, and what an engine implements
//! to take part: compute a prefill for transfer, and receive one.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::engine::{EngineError, RequestContext, TokenEngine};
use crate::kv_router::protocols::hash_full_blocks;
use crate::protocols::common::PreprocessedRequest;

/// The KV cache a prefill worker computed for a prompt, as the decode worker's engine
/// reads it: which blocks (by chained block hash, in prompt order), of what size, from
/// where. A real engine adds what its transfer needs in `engine_params` (vLLM: its
/// connector's `kv_transfer_params`); the mocker needs only the count and hashes, and
/// charges the transfer time from the block count and its bandwidth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvTransferDescriptor {
    /// The request the prefill was for.
    pub request_id: String,
    /// Instance id of the prefill worker holding the blocks.
    pub source_worker: u64,
    /// Tokens per block.
    pub block_size: usize,
    /// Chained hashes of the prompt's full blocks, first to last.
    pub block_hashes: Vec<u64>,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The engine's own transfer parameters, opaque to the core (absent for the mocker).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine_params: Option<serde_json::Value>,
}

impl KvTransferDescriptor {
    /// The descriptor of `tokens` prefilled on `source_worker` in blocks of `block_size`,
    /// carrying the engine's `engine_params`.
    pub fn for_prompt(
        request_id: impl Into<String>,
        source_worker: u64,
        tokens: &[u32],
        block_size: usize,
        engine_params: Option<serde_json::Value>,
    ) -> Self {
        KvTransferDescriptor {
            request_id: request_id.into(),
            source_worker,
            block_size,
            block_hashes: hash_full_blocks(tokens, block_size).into_iter().map(|h| h.block_hash).collect(),
            prompt_tokens: tokens.len(),
            engine_params,
        }
    }
}

/// One prefill job in the queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PrefillJob {
    /// The decode side's request id (for logs and the descriptor).
    pub request_id: String,
    /// The prompt.
    pub token_ids: Vec<u32>,
    /// Unix time (ms) after which the decode worker has stopped waiting: a prefill
    /// worker drops the job instead of computing it.
    pub deadline_unix_ms: u64,
    /// JetStream queue only: the NATS subject the answer goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_subject: Option<String>,
}

/// What a prefill worker reports about a job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefillEvent {
    /// The job left the queue: a prefill worker is computing it.
    Started {
        /// The prefill worker.
        worker: u64,
    },
    /// The prefill is done; the KV is ready to be received.
    Done(KvTransferDescriptor),
    /// The prefill failed.
    Failed {
        /// Why.
        message: String,
    },
}

/// What a prefill worker's engine does: compute a prompt and describe its KV for
/// transfer. All [`serve_prefill_worker`](super::serve_prefill_worker) needs.
#[async_trait]
pub trait KvPrefill: Send + Sync + 'static {
    /// Compute `request`'s prompt and describe the KV blocks it left, held by worker
    /// `source_worker`.
    async fn prefill_for_transfer(
        &self,
        request: PreprocessedRequest,
        ctx: RequestContext,
        source_worker: u64,
    ) -> Result<KvTransferDescriptor, EngineError>;
}

/// An engine that can take either side of disaggregated serving.
#[async_trait]
pub trait KvHandoff: TokenEngine + KvPrefill {
    /// How many leading tokens of `tokens` are in this engine's prefix cache.
    async fn cached_prefix_tokens(&self, tokens: &[u32]) -> Result<usize, EngineError>;

    /// Decode role: receive the blocks `descriptor` describes for the prompt `tokens`
    /// (waiting the transfer time) so that they count as computed here. Returns the
    /// number of blocks now cached.
    async fn receive_kv(&self, tokens: &[u32], descriptor: &KvTransferDescriptor) -> Result<usize, EngineError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_params_travel_only_when_present() {
        let tokens: Vec<u32> = (0..40).collect();
        let plain = KvTransferDescriptor::for_prompt("r", 3, &tokens, 16, None);
        assert_eq!((plain.block_hashes.len(), plain.prompt_tokens), (2, 40));
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json.get("engine_params").is_none(), "{json}");
        // A descriptor from before the field existed still parses.
        let old: KvTransferDescriptor = serde_json::from_value(json).unwrap();
        assert_eq!(old, plain);

        let params = serde_json::json!({"remote_block_ids": [[1, 2]], "remote_host": "10.0.0.1", "do_remote_prefill": true});
        let with = KvTransferDescriptor::for_prompt("r", 3, &tokens, 16, Some(params.clone()));
        let back: KvTransferDescriptor = serde_json::from_slice(&serde_json::to_vec(&with).unwrap()).unwrap();
        assert_eq!(back.engine_params, Some(params));
    }
}

//! What travels between a decode and a prefill worker, and what an engine implements
//! to take part: compute a prefill for transfer, and receive one.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::engine::{EngineError, RequestContext, TokenEngine};
use crate::protocols::common::PreprocessedRequest;

/// The KV cache a prefill worker computed for a prompt, as the decode worker's engine
/// reads it: which blocks (by chained block hash, in prompt order), of what size, from
/// where. A real engine adds its memory handles; the mocker needs only the count and
/// hashes, and charges the transfer time from the block count and its bandwidth.
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

/// An engine that can take part in disaggregated serving.
#[async_trait]
pub trait KvHandoff: TokenEngine {
    /// How many leading tokens of `tokens` are in this engine's prefix cache.
    async fn cached_prefix_tokens(&self, tokens: &[u32]) -> Result<usize, EngineError>;

    /// Prefill role: compute `request`'s prompt and describe the KV blocks it left,
    /// held by worker `source_worker`.
    async fn prefill_for_transfer(
        &self,
        request: PreprocessedRequest,
        ctx: RequestContext,
        source_worker: u64,
    ) -> Result<KvTransferDescriptor, EngineError>;

    /// Decode role: receive the blocks `descriptor` describes for the prompt `tokens`
    /// (waiting the transfer time) so that they count as computed here. Returns the
    /// number of blocks now cached.
    async fn receive_kv(&self, tokens: &[u32], descriptor: &KvTransferDescriptor) -> Result<usize, EngineError>;
}

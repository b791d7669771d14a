//! Disaggregated serving: a request's prefill runs on a *prefill* worker and its decode
//! on a *decode* worker, which receives the prompt's KV cache through a transfer
//! descriptor. Engine-agnostic: an engine takes part by implementing [`KvHandoff`]
//! (the mocker does, simulating the transfer), or a prefill worker's engine only
//! [`KvPrefill`]; the descriptor carries an engine's own transfer parameters.
//!
//! - [`DisaggConfig`]: the role and the conditional-disaggregation thresholds.
//! - [`RemotePrefill`]: the decode side's decision and remote prefill, for any engine
//!   (the Python bindings call it from a Python engine's handler).
//! - [`DisaggDecodeEngine`]: the decode role, a [`crate::engine::TokenEngine`] that
//!   prefills remotely or locally by [`DisaggConfig::prefill_remotely`].
//! - [`PrefillQueue`]: where decode workers put prefill jobs, on the request plane
//!   (embedded default) or a NATS JetStream stream (durable).
//! - [`serve_prefill_worker`]: the prefill role, pulling jobs and answering with
//!   [`KvTransferDescriptor`]s.
//!
//! See docs/disagg.md.

mod config;
mod decode;
mod handoff;
mod jetstream;
mod metrics;
mod prefill;
mod queue;

pub use config::{
    DisaggConfig, DisaggRole, DEFAULT_MAX_CONCURRENT_PREFILLS, DEFAULT_MAX_LOCAL_PREFILL_LENGTH,
    DEFAULT_MAX_PREFILL_QUEUE_SIZE,
};
pub use decode::{DisaggDecodeEngine, RemotePrefill};
pub use handoff::{KvHandoff, KvPrefill, KvTransferDescriptor, PrefillEvent, PrefillJob};
pub use metrics::{DisaggMetrics, PrefillSource};
pub use prefill::{serve_prefill_worker, PrefillWorker};
pub use queue::{default_prefill_endpoint, PrefillQueue, PrefillQueueKind};

//! The mocker: a CPU simulation of a paged-KV-cache LLM engine (vLLM-like) for testing
//! routing and serving without a GPU. It keeps a prefix cache of hashed token blocks
//! with LRU eviction, schedules requests in steps (admission by slots, token budget
//! and block watermark; chunked prefill; preemption), charges each step a simulated
//! time, and publishes the KV events and load metrics a KV-aware router consumes.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use dynamo_llm::engine::{RequestContext, TokenEngine};
//! use dynamo_llm::engines::mocker::{MockerArgs, MockerEngine};
//! use dynamo_llm::protocols::common::PreprocessedRequest;
//! let engine = MockerEngine::new(MockerArgs { speedup_ratio: 10.0, ..Default::default() }, None)?;
//! let request = PreprocessedRequest { token_ids: vec![1, 2, 3], ..Default::default() };
//! let stream = engine.generate(request, RequestContext::new("r1")).await?;
//! # drop(stream); Ok(()) }
//! ```

mod args;
mod engine;
mod evictor;
mod handoff;
mod kv_manager;
mod publisher;
mod scheduler;
mod sequence;
mod sim;
mod timing;

pub use args::{ArgsError, MockerArgs};
pub use engine::{MockerEngine, DEFAULT_MAX_TOKENS};
pub use publisher::{MockerPublisher, METRICS_MAX_INTERVAL, METRICS_MIN_INTERVAL};
pub use sim::{SimOutput, SimWorker};

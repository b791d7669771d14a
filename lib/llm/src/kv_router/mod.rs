//! KV-cache-aware routing (`--router-mode kv`): the router predicts what each worker has
//! cached from its own routing decisions, and corrects the predictions with the workers'
//! KV events (`stored`, `removed`, `cleared` on the component's `kv_events` subject) when
//! they publish them (the mocker does). A
//! request's tokens are hashed into chained full blocks (as in
//! [`crate::mocker::hash_full_blocks`]); each worker is scored by how many leading blocks it is
//! predicted to hold and by the requests the router has in flight on it.
//!
//! - [`indexer`]: per-worker predicted blocks (bounded LRU with a TTL).
//! - [`selector`]: the cost function, the temperature and the tie-break.
//! - [`scheduler`]: each worker's load (its metrics, what was sent since, its timing),
//!   the straggler penalty and the busy threshold.
//! - [`inflight`]: in-flight counts, released when a response stream ends.
//! - [`lab`]: the routing lab, a trace replayed through simulated workers.
//! - [`router`]: [`KvRouter`], which puts them together.
//!
//! Approximate where events are missing: without them, a worker's real cache may evict
//! earlier than predicted, or hold blocks it got from requests other frontends sent.

pub mod indexer;
pub mod inflight;
pub mod lab;
pub mod router;
pub mod scheduler;
pub mod selector;

pub use indexer::ApproxIndexer;
pub use inflight::{GuardedStream, InflightGuard, InflightTracker};
pub use router::{KvDecision, KvRouter, KvRouterConfig, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BLOCKS_PER_WORKER, DEFAULT_TTL};
pub use scheduler::{Choice, LoadTracker, ScheduleError, SchedulerConfig, WorkerTiming, DEFAULT_STRAGGLER_THRESHOLD};
pub use selector::{Candidate, SelectorWeights, DEFAULT_OVERLAP_WEIGHT, DEFAULT_TEMPERATURE};

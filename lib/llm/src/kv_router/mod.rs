//! KV-cache-aware routing (`--router-mode kv`): the router predicts what each worker has
//! cached from its own routing decisions, and corrects the predictions with the workers'
//! KV events (`stored`, `removed`, `cleared` on the component's `kv_events` subject) when
//! they publish them (the mocker does). A request's tokens are hashed per full block
//! ([`protocols::compute_block_hash_for_seq`]); the [`RadixTree`] of the fleet's caches
//! says how many leading blocks each worker holds, and each worker is scored by that and
//! by its load (its metrics, its queue, the requests sent since) and its speed.
//!
//! - [`protocols`]: block hashing, KV events, load metrics, subjects: what engines publish.
//! - [`publisher`]: how an engine publishes its KV events and load metrics.
//! - `lossy_sender`: the one non-blocking hand-off to a publisher task (drop, count and
//!   warn when it is behind), for KV events and the replicas' sync messages.
//! - [`indexer`]: [`KvIndexer`], a radix tree that follows a component's KV events.
//! - [`radix`]: the radix tree of every worker's cached blocks, fed by KV events and by
//!   the router's own decisions (predictions that expire).
//! - [`selector`]: the cost function, the temperature and the tie-break.
//! - [`scheduler`]: each worker's load (its metrics, what was sent since, its timing),
//!   the straggler penalty and the busy threshold.
//! - [`inflight`]: in-flight counts, released when a response stream ends.
//! - [`ttft`]: each worker's prefill queue and rate, and its wait for KV room: the
//!   router's TTFT estimate, which admission compares with a TTFT target.
//! - [`router`]: [`KvRouter`], which puts them together.
//! - [`replica`]: several routers over the same workers sharing their decisions, and a
//!   new one starting from a peer's snapshot.
//!
//! Approximate where events are missing: without them, a worker's real cache may evict
//! earlier than predicted, or hold blocks it got from requests other frontends sent.

pub mod indexer;
pub mod inflight;
pub(crate) mod lossy_sender;
pub mod protocols;
pub mod publisher;
pub mod radix;
pub mod replica;
pub mod router;
pub mod scheduler;
pub mod selector;
pub mod ttft;

pub use indexer::KvIndexer;
pub use inflight::{InflightGuard, InflightTracker};
pub use protocols::{
    compute_block_hash_for_seq, BlockHash, ForwardPassMetrics, KvCacheEvent, KvCacheEventData, KvCacheRemoveData,
    KvCacheStoreData, KvCacheStoredBlockData, LoadMetricsEvent, RouterEvent, KV_EVENTS_SUBJECT, LOAD_METRICS_SUBJECT,
};
pub use publisher::{KvEventPublisher, WorkerMetricsPublisher};
pub use radix::{IndexStats, OverlapScores, RadixTree, SnapshotBlock, WorkerId};
pub use replica::{SyncMessage, ROUTER_SYNC_SUBJECT};
pub use router::{KvDecision, KvRouter, KvRouterConfig, DEFAULT_BLOCK_SIZE, DEFAULT_MAX_BLOCKS_PER_WORKER, DEFAULT_TTL};
pub use scheduler::{Choice, LoadTracker, ScheduleError, SchedulerConfig, WorkerTiming, DEFAULT_STRAGGLER_THRESHOLD};
pub use selector::{Candidate, SelectorWeights, DEFAULT_OVERLAP_WEIGHT, DEFAULT_TEMPERATURE};

/// Spawn a task that parses each payload of `subscription` as a `T` and hands it to
/// `apply`, until the subscription ends or `apply` returns `false`; a malformed payload
/// is logged and skipped. The followers of [`KvRouter`] and [`KvIndexer`].
pub(crate) fn spawn_follow<T: serde::de::DeserializeOwned + Send + 'static>(
    mut subscription: dynamo_runtime::events::Subscription,
    what: &'static str,
    mut apply: impl FnMut(T) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(event) = subscription.next_event().await {
            match serde_json::from_slice::<T>(&event.payload) {
                Ok(item) => {
                    if !apply(item) {
                        return;
                    }
                }
                Err(e) => tracing::warn!(subject = event.subject, error = %e, "ignoring a malformed {what}"),
            }
        }
    })
}

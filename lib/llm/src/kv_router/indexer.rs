//! [`KvIndexer`]: a [`RadixTree`] that follows the KV events of a component's workers
//! and forgets a worker once its instance leaves discovery.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use dynamo_runtime::{Component, Result};
use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::protocols::{compute_block_hash_for_seq_salted, RouterEvent, KV_EVENTS_SUBJECT};
use super::radix::{OverlapScores, RadixTree, WorkerId};

/// How often the indexer looks for workers that left discovery.
pub const INSTANCE_POLL_INTERVAL: Duration = Duration::from_secs(1);

/// The fleet's KV cache index for one component. Dropping it stops following.
#[derive(Debug)]
pub struct KvIndexer {
    tree: Arc<Mutex<RadixTree>>,
    /// The workers its last look at discovery found.
    listed: Arc<Mutex<Vec<WorkerId>>>,
    block_size: usize,
    cancel: CancellationToken,
    events: JoinHandle<()>,
}

impl Drop for KvIndexer {
    fn drop(&mut self) {
        self.cancel.cancel();
        self.events.abort();
    }
}

impl KvIndexer {
    /// Subscribe to `component`'s `kv_events` and start applying them; `block_size`
    /// (tokens per block, at least 1) is the workers' KV block size. Must be called
    /// within a tokio runtime.
    pub async fn new(component: Component, block_size: usize) -> Result<Self> {
        let subscription = component.subscribe(KV_EVENTS_SUBJECT).await?;
        let tree = Arc::new(Mutex::new(RadixTree::new()));
        let cancel = CancellationToken::new();
        let applied = tree.clone();
        let events = super::spawn_follow(subscription, "KV event", move |event: RouterEvent| {
            applied.lock().apply_router_event(&event);
            true
        });
        let listed = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(forget_departed_workers(component, tree.clone(), listed.clone(), cancel.clone()));
        Ok(KvIndexer { tree, listed, block_size: block_size.max(1), cancel, events })
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Leading blocks of a request (its blocks' tokens hashes) each worker holds.
    pub fn find_matches(&self, tokens_hashes: &[u64]) -> OverlapScores {
        self.tree.lock().find_matches(tokens_hashes)
    }

    /// Leading full blocks of `tokens` each worker holds (blocks of LoRA adapter
    /// `adapter`, if given).
    pub fn find_matches_for_request(&self, tokens: &[u32], adapter: Option<&str>) -> OverlapScores {
        self.find_matches(&compute_block_hash_for_seq_salted(tokens, self.block_size, adapter))
    }

    /// The workers (ascending) its last look at discovery found, every
    /// [`INSTANCE_POLL_INTERVAL`]: it forgets a worker only once it saw it listed here.
    pub fn listed_workers(&self) -> Vec<WorkerId> {
        self.listed.lock().clone()
    }

    /// The index itself (to dump it, read its counters, or remove a worker by hand).
    pub fn tree(&self) -> &Mutex<RadixTree> {
        &self.tree
    }
}

/// Remove from the tree the workers whose instance was listed in discovery and no
/// longer is (a worker that publishes before it registers is left alone).
async fn forget_departed_workers(
    component: Component,
    tree: Arc<Mutex<RadixTree>>,
    listed: Arc<Mutex<Vec<WorkerId>>>,
    cancel: CancellationToken,
) {
    let mut seen: HashSet<WorkerId> = HashSet::new();
    let mut tick = tokio::time::interval(INSTANCE_POLL_INTERVAL);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live: HashSet<WorkerId> = match component.list_instances().await {
            Ok(instances) => {
                tracing::trace!(n = instances.len(), "listed instances");
                instances.iter().map(|i| i.instance_id).collect()
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot list instances; keeping the index as it is");
                continue;
            }
        };
        if live != seen {
            tracing::debug!(component = component.name(), instances = ?live, "instances of the indexed component");
        }
        let departed: Vec<WorkerId> = seen.difference(&live).copied().collect();
        if !departed.is_empty() {
            let mut tree = tree.lock();
            for worker in departed {
                tracing::debug!(worker, "worker left discovery; removing its blocks from the index");
                tree.remove_worker(worker);
            }
        }
        let mut ids: Vec<WorkerId> = live.iter().copied().collect();
        ids.sort_unstable();
        *listed.lock() = ids;
        seen = live;
    }
}

//! Router replicas: several routers in front of the same workers (frontends, router
//! components) share what they decide on the workers' component event plane, subject
//! [`ROUTER_SYNC_SUBJECT`], so that their views of the workers agree:
//!
//! - `routed`: a replica sent a request to a worker. Peers count its blocks on that worker
//!   (until the worker's metrics include it, as for their own requests) and record its
//!   prefix as predicted there (confirmed or corrected by KV events where workers publish
//!   them; the only source of cache contents in approximate mode).
//! - `ended`: that request's stream ended; peers stop counting it.
//! - `hello`: a replica started (sent once: the event plane delivers a new publisher's
//!   first message to every replica already subscribed). One peer answers (each waits a random moment up to [`ANSWER_JITTER`] and
//!   stays quiet when another answer has begun) with:
//! - `snapshot`: its index (confirmed and predicted blocks, see
//!   [`super::radix::RadixTree::snapshot`]) in parts of at most [`SNAPSHOT_PART_BLOCKS`]
//!   blocks, so the new replica does not start from an empty tree. The new replica routes
//!   at once, and merges the snapshot as it arrives.
//!
//! Every message names its sender (`replica`, a random id per router), so a router
//! ignores its own. Messages are JSON; a malformed one is logged and skipped; when the
//! event plane is away, messages are dropped (counted), never queued without bound: a
//! replica that missed some still routes, on a slightly less accurate view.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dynamo_runtime::component::Component;
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use tokio::task::JoinHandle;

use super::lossy_sender::LossySender;
use super::radix::SnapshotBlock;

/// Where router replicas of a component's workers talk (on that component).
pub const ROUTER_SYNC_SUBJECT: &str = "kv_router_sync";
/// Most blocks in one `snapshot` message (about 300 kB of JSON; NATS carries 1 MB).
pub const SNAPSHOT_PART_BLOCKS: usize = 4096;
/// A peer waits a random moment up to this before answering a `hello`, so that one
/// answers and the others see it and stay quiet.
pub const ANSWER_JITTER: Duration = Duration::from_millis(100);
/// A peer's request whose `ended` never came (the peer died) stops counting after this.
pub const PEER_REQUEST_TTL: Duration = Duration::from_secs(600);
/// Messages waiting for the event plane before new ones are dropped.
const OUTBOX: usize = 4096;

/// What replicas tell each other.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SyncMessage {
    /// `replica` sent its request `request` (its own id) of `blocks` KV blocks to
    /// `worker`; `hashes` are the tokens hashes of its full blocks of `block_size` tokens.
    Routed {
        /// The sender.
        replica: u64,
        /// The sender's id of the request.
        request: u64,
        /// The worker it went to.
        worker: u64,
        /// KV blocks it will hold there.
        blocks: u64,
        /// Tokens per block of `hashes`.
        block_size: u32,
        /// Tokens hashes of the prompt's full blocks.
        hashes: Vec<u64>,
    },
    /// The request `request` of `replica` ended.
    Ended {
        /// The sender.
        replica: u64,
        /// The sender's id of the request.
        request: u64,
    },
    /// `replica` started and asks for a snapshot.
    Hello {
        /// The new replica.
        replica: u64,
    },
    /// Part `part` of `replica`'s index, for the new replica `to`.
    Snapshot {
        /// The sender.
        replica: u64,
        /// The replica that asked.
        to: u64,
        /// 0, 1, ...
        part: u32,
        /// Whether this is the last part.
        last: bool,
        /// Tokens per block of the index.
        block_size: u32,
        /// The blocks, each after its parent.
        blocks: Vec<SnapshotBlock>,
    },
}

/// A peer's request, as counted here.
#[derive(Debug, Clone, Copy)]
struct PeerRequest {
    worker: u64,
    /// Its id in this router's load tracker.
    sent: u64,
    blocks: u64,
    at: Instant,
}

/// What replica sync needs of its router ([`super::router::KvRouter`] implements it), so
/// that this file does not import the router.
pub(crate) trait ReplicaHost: Send + Sync + 'static {
    /// The router's replica state.
    fn replica(&self) -> &Arc<ReplicaState>;
    /// Tokens per KV block of the router's index.
    fn block_size(&self) -> u32;
    /// Count a peer's decision (`blocks` on `worker`, its prefix `hashes` when the block
    /// sizes agree) as this router's own; returns its id in the load tracker.
    fn apply_peer_decision(&self, worker: u64, blocks: u64, hashes: Option<&Vec<u64>>, now: Instant) -> u64;
    /// Stop counting a peer's decision `sent` of `blocks` blocks on `worker`.
    fn forget_peer_decision(&self, worker: u64, sent: u64, blocks: u64, now: Instant);
    /// The router's index as snapshot blocks.
    fn snapshot(&self, now: Instant) -> Vec<SnapshotBlock>;
    /// Merge a peer's snapshot blocks into the index.
    fn restore(&self, blocks: &[SnapshotBlock], now: Instant);
    /// Keep `tasks` alive as long as the router (aborted when it is dropped).
    fn add_tasks(&self, tasks: Vec<JoinHandle<()>>);
}

/// The replica side of a KV router: its id, its outbox, and what it knows of peers.
#[derive(Debug)]
pub(crate) struct ReplicaState {
    pub(crate) id: u64,
    /// Set once sync starts.
    outbox: OnceLock<LossySender<SyncMessage>>,
    peers: parking_lot::Mutex<Peers>,
}

#[derive(Debug, Default)]
struct Peers {
    requests: HashMap<(u64, u64), PeerRequest>,
    /// New replicas whose snapshot some peer began sending, and when.
    answered: HashMap<u64, Instant>,
    /// The peer whose snapshot this replica is restoring, and whether it is complete.
    snapshot_from: Option<u64>,
    snapshot_done: bool,
    snapshot_blocks: usize,
}

impl ReplicaState {
    pub(crate) fn new() -> Self {
        ReplicaState {
            id: rand::rng().random(),
            outbox: OnceLock::new(),
            peers: parking_lot::Mutex::new(Peers::default()),
        }
    }

    /// Whether sync is on (messages go out).
    pub(crate) fn is_syncing(&self) -> bool {
        self.outbox.get().is_some()
    }

    /// Hand `message` to the publisher task, or drop it (counted) when it is behind or
    /// sync is off.
    pub(crate) fn send(&self, message: SyncMessage) {
        if let Some(outbox) = self.outbox.get() {
            outbox.send(message);
        }
    }

    /// Whether the snapshot from a peer has been restored in full.
    pub(crate) fn snapshot_restored(&self) -> Option<(u64, usize)> {
        let peers = self.peers.lock();
        (peers.snapshot_done).then(|| (peers.snapshot_from.unwrap_or_default(), peers.snapshot_blocks))
    }
}

/// Start sharing `router`'s decisions with the other replicas on `component`'s event
/// plane, and ask them for a snapshot. The tasks end when the router is dropped.
pub(crate) async fn start<R: ReplicaHost>(router: &Arc<R>, component: &Component) -> dynamo_runtime::Result<()> {
    let state = router.replica().clone();
    if state.is_syncing() {
        return Ok(());
    }
    let mut subscription = component.subscribe(ROUTER_SYNC_SUBJECT).await?;
    let (tx, mut rx) = mpsc::channel::<SyncMessage>(OUTBOX);
    if state.outbox.set(LossySender::new(tx, "router replica sync is behind; dropping messages")).is_err() {
        return Ok(()); // started concurrently by another caller
    }
    let publisher = component.clone();
    let publish = tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            match serde_json::to_vec(&message) {
                Ok(payload) => {
                    if let Err(e) = publisher.publish(ROUTER_SYNC_SUBJECT, Bytes::from(payload)).await {
                        tracing::debug!(error = %e, "cannot publish a router sync message");
                    }
                }
                Err(e) => tracing::error!(error = %e, "cannot encode a router sync message"),
            }
        }
    });
    let weak = Arc::downgrade(router);
    let follow = tokio::spawn(async move {
        while let Some(event) = subscription.next_event().await {
            let Some(router) = weak.upgrade() else { return };
            match serde_json::from_slice::<SyncMessage>(&event.payload) {
                Ok(message) => receive(&router, message),
                Err(e) => tracing::warn!(subject = event.subject, error = %e, "ignoring a malformed router sync message"),
            }
        }
    });
    state.send(SyncMessage::Hello { replica: state.id });
    router.add_tasks(vec![publish, follow]);
    tracing::debug!(replica = %format_args!("{:x}", state.id), component = component.name(), "router replica sync started");
    Ok(())
}

/// Apply a message from the event plane (ignoring this router's own).
pub(crate) fn receive<R: ReplicaHost>(router: &Arc<R>, message: SyncMessage) {
    let state = router.replica();
    let now = Instant::now();
    match message {
        SyncMessage::Routed { replica, .. }
        | SyncMessage::Ended { replica, .. }
        | SyncMessage::Hello { replica }
        | SyncMessage::Snapshot { replica, .. }
            if replica == state.id => {}
        SyncMessage::Routed { replica, request, worker, blocks, block_size, hashes } => {
            let sent = router.apply_peer_decision(worker, blocks, (block_size == router.block_size()).then_some(&hashes), now);
            tracing::debug!(from = %format_args!("{replica:x}"), worker, blocks, "applied a peer replica's routing decision");
            let mut peers = state.peers.lock();
            if peers.requests.len() >= 4096 && peers.requests.len().is_power_of_two() {
                // Requests whose `ended` was lost (their replica died) stop counting.
                let mut lost = Vec::new();
                peers.requests.retain(|_, r| {
                    let keep = now.saturating_duration_since(r.at) < PEER_REQUEST_TTL;
                    if !keep {
                        lost.push(*r);
                    }
                    keep
                });
                for r in lost {
                    router.forget_peer_decision(r.worker, r.sent, r.blocks, now);
                }
            }
            peers.requests.insert((replica, request), PeerRequest { worker, sent, blocks, at: now });
        }
        SyncMessage::Ended { replica, request } => {
            let ended = state.peers.lock().requests.remove(&(replica, request));
            if let Some(r) = ended {
                router.forget_peer_decision(r.worker, r.sent, r.blocks, now);
            }
        }
        SyncMessage::Hello { replica } => {
            let weak = Arc::downgrade(router);
            tokio::spawn(answer_hello(weak, replica));
        }
        SyncMessage::Snapshot { replica, to, part, last, block_size, blocks } => {
            let mut peers = state.peers.lock();
            if to != state.id {
                peers.answered.insert(to, now);
                return;
            }
            if peers.snapshot_done || *peers.snapshot_from.get_or_insert(replica) != replica {
                return; // another peer answered first
            }
            if block_size == router.block_size() {
                router.restore(&blocks, now);
                peers.snapshot_blocks += blocks.len();
            }
            if last {
                peers.snapshot_done = true;
                tracing::info!(
                    from = %format_args!("{replica:x}"),
                    parts = part + 1,
                    blocks = peers.snapshot_blocks,
                    "router replica restored a peer's snapshot"
                );
            }
        }
    }
}

/// Answer a new replica's `hello` with this router's snapshot, unless another peer
/// begins first.
async fn answer_hello<R: ReplicaHost>(router: Weak<R>, to: u64) {
    let wait = rand::rng().random_range(Duration::ZERO..=ANSWER_JITTER);
    tokio::time::sleep(wait).await;
    let Some(router) = router.upgrade() else { return };
    let state = router.replica();
    {
        // Another peer began answering this hello (or an earlier one moments ago).
        let mut peers = state.peers.lock();
        let now = Instant::now();
        if peers.answered.get(&to).is_some_and(|at| now.saturating_duration_since(*at) < 2 * ANSWER_JITTER) {
            return;
        }
        peers.answered.insert(to, now);
    }
    let blocks = router.snapshot(Instant::now());
    let block_size = router.block_size();
    let parts: Vec<&[SnapshotBlock]> =
        if blocks.is_empty() { vec![&[]] } else { blocks.chunks(SNAPSHOT_PART_BLOCKS).collect() };
    let count = parts.len();
    for (part, chunk) in parts.into_iter().enumerate() {
        state.send(SyncMessage::Snapshot {
            replica: state.id,
            to,
            part: part as u32,
            last: part + 1 == count,
            block_size,
            blocks: chunk.to_vec(),
        });
    }
    tracing::debug!(to = %format_args!("{to:x}"), blocks = blocks.len(), "sent a snapshot to a new router replica");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_tagged_json() {
        let routed = SyncMessage::Routed { replica: 1, request: 2, worker: 3, blocks: 4, block_size: 16, hashes: vec![5, 6] };
        let json = serde_json::to_value(&routed).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"kind": "routed", "replica": 1, "request": 2, "worker": 3, "blocks": 4, "block_size": 16, "hashes": [5, 6]})
        );
        assert_eq!(serde_json::from_value::<SyncMessage>(json).unwrap(), routed);
        let hello: SyncMessage = serde_json::from_str(r#"{"kind": "hello", "replica": 9}"#).unwrap();
        assert_eq!(hello, SyncMessage::Hello { replica: 9 });
    }
}

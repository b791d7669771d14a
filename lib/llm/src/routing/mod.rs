//! How a frontend picks the worker instance of a request, shaped like SGLang's router
//! `policies/`: one [`RouterMode`] (parsed once: `--router-mode`, the Python frontend,
//! the routing lab), one [`Selector`] trait, one file per policy.
//!
//! - [`round_robin`], [`random`], [`direct`] (one given instance), [`kv`] (over
//!   [`crate::kv_router::KvRouter`]). The routing lab ([`crate::routing_lab`]) replays
//!   traces through the same selectors.
//!
//! Imports run one way: `routing` uses `kv_router`; the remote engine
//! ([`crate::remote`]) and the routing lab use `routing`. A new policy is a new file
//! here with a `Selector`, a variant of [`RouterMode`] and its arm in [`selector`].

mod direct;
mod kv;
mod random;
mod round_robin;
mod router_mode;

use std::fmt;
use std::sync::Arc;

use crate::kv_router::{InflightGuard, KvRouter};

pub use direct::Direct;
pub use kv::KvSelector;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use router_mode::{RouterMode, UnknownRouterMode};

/// The instance a [`Selector`] picked for one request.
#[derive(Debug)]
pub struct Pick {
    /// Where to send the request.
    pub instance: u64,
    /// Prompt blocks the instance is predicted to hold (KV routing), sent to the worker
    /// as `estimated_prefix_hit_num_blocks`.
    pub overlap_blocks: Option<usize>,
    /// Counts the request in flight on the instance (KV routing) until dropped: the
    /// sender holds it for the life of the response stream, so the request's end is
    /// the guard's drop.
    pub load: Option<InflightGuard>,
}

impl Pick {
    /// A choice of `instance` with nothing more to hold.
    pub fn of(instance: u64) -> Self {
        Pick { instance, overlap_blocks: None, load: None }
    }
}

/// Why a [`Selector`] chose no instance.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// There is no candidate.
    #[error("no instance to choose from")]
    NoCandidates,
    /// Every candidate is past its load threshold.
    #[error("{0}")]
    AllBusy(String),
}

/// A routing policy: picks the instance for each request.
pub trait Selector: Send + Sync + fmt::Debug {
    /// The instance for a request of prompt `tokens` among `candidates` (the routable
    /// instances, ascending by id, those the request already failed on left out).
    fn select(&self, tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError>;

    /// A request ended because `instance` could not be reached or is gone (the end of
    /// a request that ran is the drop of its [`Pick::load`]).
    fn on_end_unreachable(&self, instance: u64) {
        let _ = instance;
    }
}

/// The selector of `mode`; `Kv` needs `router` (without one it is round-robin).
pub fn selector(mode: RouterMode, router: Option<Arc<KvRouter>>) -> Arc<dyn Selector> {
    match (mode, router) {
        (RouterMode::Kv, Some(router)) => Arc::new(KvSelector::new(router)),
        (RouterMode::Random, _) => Arc::new(Random::new()),
        (RouterMode::RoundRobin | RouterMode::Kv, _) => Arc::new(RoundRobin::new()),
    }
}

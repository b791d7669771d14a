//! How a frontend picks the worker instance of a request, shaped like SGLang's router
//! `policies/`: one [`RouterMode`] (parsed once: `--router-mode`, the Python frontend,
//! the routing lab), one [`Selector`] trait, one file per policy.
//!
//! - [`round_robin`], [`random`], [`direct`] (one given instance), [`kv`] (over
//!   [`crate::kv_router::KvRouter`]). The routing lab ([`crate::routing_lab`]) replays
//!   traces through the same selectors.
//! - A selector's life cycle per request: [`Selector::select`] picks the instance, and
//!   [`Selector::on_end`] is told once how the request ended there (completed, failed,
//!   cancelled, or the instance gone); [`TrackedStream`] calls it for a stream that ran.
//! - [`Selector::ttft_estimate`]: the time to first token the policy expects for a
//!   request now (admission's TTFT target): the KV router's for the best worker; for
//!   round-robin and random, the mean over the candidates of requests waiting for a
//!   first item × the time per waiting request they observed
//!   ([`crate::kv_router::ttft`]).
//!
//! Imports run one way: `routing` uses `kv_router`; the remote engine
//! ([`crate::remote`]) and the routing lab use `routing`. A new policy is a new file
//! here with a `Selector`, a variant of [`RouterMode`] and its arm in [`selector`].

mod direct;
mod kv;
mod random;
mod round_robin;
mod router_mode;
mod tracked;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::kv_router::{InflightGuard, KvRouter};

pub use direct::Direct;
pub use kv::KvSelector;
pub use random::Random;
pub use round_robin::RoundRobin;
pub use router_mode::{RouterMode, UnknownRouterMode};
pub use tracked::TrackedStream;

/// The instance a [`Selector`] picked for one request.
#[derive(Debug)]
pub struct Pick {
    /// Where to send the request.
    pub instance: u64,
    /// Prompt blocks the instance is predicted to hold (KV routing), sent to the worker
    /// as `estimated_prefix_hit_num_blocks`.
    pub overlap_blocks: Option<usize>,
    /// Counts the request in flight on the instance (KV routing) and times its items,
    /// until the selector's [`Selector::on_end`] ends it (or, failing that, its drop).
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

/// How a request sent to a [`Pick`]'s instance ended there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Its stream ended.
    Completed,
    /// Its stream ended with an error (the worker's, or the path to it), or it could not
    /// be sent.
    Failed,
    /// The caller dropped its stream before the end (a client gone, a resend elsewhere).
    Cancelled,
    /// The instance could not be reached or is no longer registered.
    Gone,
}

/// A routing policy: picks the instance for each request, and hears how it ended.
pub trait Selector: Send + Sync + fmt::Debug {
    /// The instance for a request of prompt `tokens` (empty for an OpenAI-level request,
    /// which the frontend does not tokenize) among `candidates` (the routable instances,
    /// ascending by id, those the request already failed on left out).
    fn select(&self, tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError>;

    /// The request of `choice` ended with `outcome`: called once per [`Pick`] the
    /// selector returned and the caller used (by [`TrackedStream`] for a stream that
    /// ran). Bookkeeping the pick started ends here.
    fn on_end(&self, choice: Pick, outcome: Outcome) {
        let _ = (choice, outcome);
    }

    /// The selector's estimate of the time to first token of a request of prompt
    /// `tokens` (empty when unknown) sent now among `candidates`; `None` when it cannot
    /// say (nothing timed yet, or a policy that does not track its workers). Admission
    /// compares it with the TTFT target.
    fn ttft_estimate(&self, tokens: &[u32], candidates: &[u64]) -> Option<Duration> {
        let _ = (tokens, candidates);
        None
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

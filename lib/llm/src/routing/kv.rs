//! KV-cache-aware routing over [`KvRouter`]: the candidate with the lowest predicted
//! cost (prefill of the blocks it does not hold, plus its decode load).

use std::sync::Arc;

use super::round_robin::RoundRobin;
use super::{Pick, SelectError, Selector};
use crate::kv_router::{KvRouter, ScheduleError};

/// Routes with a [`KvRouter`]; candidates it does not know yet go round-robin.
#[derive(Debug)]
pub struct KvSelector {
    router: Arc<KvRouter>,
    fallback: RoundRobin,
}

impl KvSelector {
    /// Route with `router`.
    pub fn new(router: Arc<KvRouter>) -> Self {
        KvSelector { router, fallback: RoundRobin::new() }
    }

    /// The router it routes with.
    pub fn router(&self) -> &Arc<KvRouter> {
        &self.router
    }
}

impl Selector for KvSelector {
    fn select(&self, tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError> {
        match self.router.route(tokens, candidates) {
            Ok(decision) => Ok(Pick {
                instance: decision.worker,
                overlap_blocks: Some(decision.overlap_blocks),
                load: Some(self.router.start_decision(&decision)),
            }),
            Err(e @ ScheduleError::AllBusy { .. }) => Err(SelectError::AllBusy(e.to_string())),
            Err(ScheduleError::NoWorkers) => self.fallback.select(tokens, candidates),
        }
    }

    fn on_end_unreachable(&self, instance: u64) {
        self.router.remove_worker(instance);
    }
}

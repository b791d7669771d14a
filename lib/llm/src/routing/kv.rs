//! KV-cache-aware routing over [`KvRouter`]: the candidate with the lowest predicted
//! cost (prefill of the blocks it does not hold, plus its decode load).

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::SeedableRng;

use super::round_robin::RoundRobin;
use super::{Outcome, Pick, SelectError, Selector};
use crate::kv_router::{KvRouter, ScheduleError};

/// Routes with a [`KvRouter`]; candidates it does not know yet go round-robin.
#[derive(Debug)]
pub struct KvSelector {
    router: Arc<KvRouter>,
    fallback: RoundRobin,
    /// A replay's virtual clock and seeded draws; the wall clock and the thread's
    /// generator when `None`.
    replay: Option<Mutex<Replay>>,
}

/// The clock and draws of a replaying [`KvSelector`].
#[derive(Debug)]
struct Replay {
    now: Instant,
    rng: StdRng,
}

impl KvSelector {
    /// Route with `router`.
    pub fn new(router: Arc<KvRouter>) -> Self {
        KvSelector { router, fallback: RoundRobin::new(), replay: None }
    }

    /// Route with `router` on a virtual clock starting at `start`, drawing (ties,
    /// temperature) from a generator seeded with `seed`: the routing lab's replay, the
    /// same picks every run. Move the clock with [`Self::set_clock`].
    pub fn replaying(router: Arc<KvRouter>, start: Instant, seed: u64) -> Self {
        let replay = Replay { now: start, rng: StdRng::seed_from_u64(seed) };
        KvSelector { router, fallback: RoundRobin::starting_at(0), replay: Some(Mutex::new(replay)) }
    }

    /// A replaying selector's clock is now `now`: the next selects and ends happen
    /// then. No effect on a selector on the wall clock.
    pub fn set_clock(&self, now: Instant) {
        if let Some(replay) = &self.replay {
            replay.lock().now = now;
        }
    }

    fn now(&self) -> Instant {
        self.replay.as_ref().map_or_else(Instant::now, |r| r.lock().now)
    }

    /// The router it routes with.
    pub fn router(&self) -> &Arc<KvRouter> {
        &self.router
    }
}

impl Selector for KvSelector {
    fn select(&self, tokens: &[u32], candidates: &[u64]) -> Result<Pick, SelectError> {
        let routed = match &self.replay {
            Some(replay) => {
                let Replay { now, rng } = &mut *replay.lock();
                self.router.route_with(tokens, candidates, *now, rng)
            }
            None => self.router.route(tokens, candidates),
        };
        match routed {
            Ok(decision) => Ok(Pick {
                instance: decision.worker,
                overlap_blocks: Some(decision.overlap_blocks),
                load: Some(self.router.start_decision(&decision)),
            }),
            Err(e @ ScheduleError::AllBusy { .. }) => Err(SelectError::AllBusy(e.to_string())),
            Err(ScheduleError::NoWorkers) => self.fallback.select(tokens, candidates),
        }
    }

    fn on_end(&self, choice: Pick, outcome: Outcome) {
        if outcome == Outcome::Gone {
            self.router.remove_worker(choice.instance);
        }
        // The request's load and blocks stop counting on its worker.
        if let Some(load) = choice.load {
            load.end_at(self.now());
        }
    }

    fn ttft_estimate(&self, tokens: &[u32], candidates: &[u64]) -> Option<Duration> {
        self.router.ttft_estimate(tokens, candidates, self.now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_router::KvRouterConfig;

    #[test]
    fn a_pick_counts_until_its_end_and_a_gone_instance_is_forgotten() {
        let router = KvRouter::new(KvRouterConfig::with_block_size(Some(4)));
        let kv = KvSelector::new(router.clone());
        let tokens: Vec<u32> = (0..16).collect();
        let pick = kv.select(&tokens, &[1, 2]).unwrap();
        let worker = pick.instance;
        assert_eq!(router.inflight(worker), 1);
        kv.on_end(pick, Outcome::Completed);
        assert_eq!(router.inflight(worker), 0, "on_end released the load");
        let pick = kv.select(&tokens, &[worker]).unwrap();
        assert_eq!(router.predicted_overlap(worker, &tokens), 4, "predicted from the decisions");
        kv.on_end(pick, Outcome::Gone);
        assert_eq!(router.predicted_overlap(worker, &tokens), 0, "a gone instance leaves the index");
        assert_eq!(router.inflight(worker), 0);
    }
}

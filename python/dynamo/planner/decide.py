"""Decisions: how many replicas each role should have, from two loops.

* The **throughput loop** (every ``intervals.throughput_s``) sets a role's *floor*: the
  forecast request rate (for when a replica asked for now would serve: ``step.py``) ÷
  what one replica serves within the targets (the profile's capacity, live-corrected),
  rounded up. It only ever raises the fleet to its floor, and not on a falling demand
  (see below), where the load loop's removals under the floor stand.
* The **load loop** (every ``intervals.load_s``) grows in proportion when the rate it
  observed needs more replicas than the role holds (pending ones counted as capacity) by
  the profile's capacity at the targets, and the fleet is over a target or holds a
  backlog (more waiting requests than ready replicas): to ``ceil((rate + waiting /
  throughput_s) / capacity)`` at once (the backlog served within one throughput
  interval), not +1 a pass. Otherwise it adds one replica when an observed quantile is
  over its target, unless one is starting, or (with a profile) the fleet is already twice
  what the rate needs (the latency is a long request's own: more replicas do not shorten
  it), or the profile says the fleet carries the rate and the backlog is already
  shrinking or has just emptied: the late requests of a backlog keep the quantiles over
  the target while it drains, and for the window after its last request started, and
  more replicas would not drain the queues the old ones hold.
* It removes one only when the fleet with one replica fewer is predicted to stay under
  ``(1 - scale_down_margin)`` times each target at the observed rate: by the profile's
  capacity, and, where the profile shows the engine saturate, by the wait for a slot
  that open-loop arrivals meet there (``PerformanceModel.slot_wait``, at the steadier
  ``_demand``), which the profile's closed loop never shows. Never while more
  requests wait in the workers' queues than replicas would remain or the observed
  latencies are already over that line (one replica fewer cannot do better), nor while
  the throughput loop's forecast rises (unless the observed rate fell under the earlier
  forecast since), nor until more than one throughput interval
  after the role grew (unless demand is gone). Between that line and the target nothing
  moves: that band is the hysteresis that keeps a constant load from flapping 2↔1. When
  the throughput loop's last ``FALLING_FORECASTS`` forecasts each fell, in all by more
  than ``FALL_NOISE_SIGMAS`` standard deviations of one window's Poisson arrival rate,
  the demand falls rather than wobbles: the check is made at the lower of the observed
  rate and the latest forecast, with half the margin, and without waiting for
  ``scale_down_windows`` passes in a row (a fleet that shrinks late on a fall pays for
  it in GPU time, and a fall does not flap). The floor and that forecast then follow the forecast's trend from the
  throughput pass to each load pass (up to one throughput interval on): a fall goes on
  between the throughput passes, and a floor held at the last pass's forecast lags it.
  When nothing arrived or waited over ``QUIET_WINDOWS`` load windows in a row, the load
  stopped: the fleet goes at once to one replica for each request still in flight (or
  ``min_replicas``), whatever the floor or a recent growth, and a quantile over a target
  in a window in which nothing arrived (a long request that ended) adds nothing; a
  throughput pass after such a window sets its floor but does not raise to it.
  A scale-down that a backlog undoes teaches the role a ceiling (``_learn``): the
  per-replica load the smaller fleet could not carry, under which later scale-downs
  keep a replica's load by the margin near that demand (a closed-loop profile overstates
  a saturated engine, where the latency margin gives no rate band; the slot wait
  answers that when the sweep reached the saturation, the ceiling when it did not).
* The **urgent check** (every ``intervals.urgent_s``, between load passes; ``step.py``
  decides when it looks) acts on a queue that builds in the workers faster than a load
  interval: more waiting requests than ready replicas, rising at each check. It takes the
  demand as what the ready replicas serve (their capacity, or the last load pass's rate
  when higher) plus the queue's growth a second, sizes the fleet
  for it as the load loop sizes a backlog, and counts the replicas it adds at their
  warm-up speed (``warmup_speed``): they carry less while they warm up. It only grows.

A replica that was started but is not ready yet (*pending*) is counted in the fleet,
never waited for: a scale-down decision is made as if it were there, and executing it
removes a pending replica first. A missing or stale signal is a decision too: *hold*,
with the missing signals named (``Decision.missing``), never a silent no-op.
Every target is then constrained by ``min_replicas``/``max_replicas`` and the GPU budget.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dynamo.planner.config import PlannerConfig, RoleConfig
from dynamo.planner.profile import PerformanceModel


@dataclass(frozen=True)
class RoleState:
    """A role's replicas as the connector knows them."""

    ready: int
    #: Started (or asked for) and not ready yet.
    pending: int = 0

    @property
    def total(self) -> int:
        """Every replica the role holds, ready or not."""
        return self.ready + self.pending


@dataclass(frozen=True)
class Observation:
    """What the load loop saw over its last interval."""

    #: Requests/s reaching the frontend (``None``: unknown).
    request_rate: float | None
    #: Mean input length (tokens).
    isl: float | None
    #: The observed latencies at the targets' quantiles (``None``: no request ended).
    ttft_ms: float | None
    itl_ms: float | None
    #: Requests the workers hold waiting (their load reports); a sign of demand at zero replicas.
    waiting: int = 0
    #: Requests the frontend saw find no worker (waiting for one now, or arrived at zero
    #: workers during the interval; ``--keep-models``): the demand signal at zero replicas.
    waiting_for_workers: int = 0
    #: Requests the frontend held in flight at the window's end.
    inflight: float = 0.0
    #: Names of the signals that are missing or stale.
    missing: tuple[str, ...] = ()

    @property
    def demand(self) -> bool:
        """Whether anything arrived over the window or waits now."""
        return (self.request_rate or 0.0) > 0 or self.waiting > 0 or self.waiting_for_workers > 0

    @property
    def quiet(self) -> bool:
        """Whether nothing arrived over the window and nothing waits (a signal missing is
        not quiet)."""
        return not self.missing and self.request_rate is not None and not self.demand


@dataclass(frozen=True)
class Decision:
    """One loop's verdict on one role."""

    role: str
    loop: str  # "throughput" | "load" | "urgent"
    current: int
    target: int
    reason: str
    missing: tuple[str, ...] = ()

    @property
    def change(self) -> int:
        """Replicas to add (positive) or remove (negative)."""
        return self.target - self.current

    @property
    def action(self) -> str:
        """``up``, ``down`` or ``hold``."""
        return "up" if self.change > 0 else "down" if self.change < 0 else "hold"


def count_reversals(changes: Iterable[int]) -> int:
    """Direction changes in a sequence of replica changes (zeros skipped): up then down,
    or down then up, is one reversal."""
    reversals, last = 0, 0
    for change in changes:
        if change == 0:
            continue
        sign = 1 if change > 0 else -1
        if last and sign != last:
            reversals += 1
        last = sign
    return reversals


#: Load windows in a row in which nothing arrives or waits for the load to count as
#: stopped: one is a lull of a bursty load as often.
QUIET_WINDOWS = 2
#: Demand forecasts that must each fall for a scale-down to count the demand as falling.
FALLING_FORECASTS = 3
#: Standard deviations of one throughput window's arrival rate (Poisson, at the first of
#: those forecasts) by which they must fall in all: less is the noise of a level load.
FALL_NOISE_SIGMAS = 2.0


class Decider:
    """The two loops' rules over one configuration and (optionally) a performance model."""

    def __init__(self, config: PlannerConfig, model: PerformanceModel | None = None) -> None:
        self.config = config
        self.model = model
        #: Each role's floor from the last throughput pass.
        self.floors: dict[str, int] = {name: role.min_replicas for name, role in config.roles.items()}
        #: Each role's consecutive load passes in which one replica fewer fitted.
        self.fits_in_a_row: dict[str, int] = {name: 0 for name in config.roles}
        #: Each role's consecutive load passes with a quantile over its target.
        self.over_in_a_row: dict[str, int] = {name: 0 for name in config.roles}
        #: Each role's consecutive load windows in which nothing arrived or waited.
        self.quiet_in_a_row: dict[str, int] = {name: 0 for name in config.roles}
        #: Each role's waiting requests at its last load pass (whether a backlog shrinks).
        self.last_waiting: dict[str, int] = {}
        #: Each role's last ``FALLING_FORECASTS`` demand forecasts (req/s), the latest last.
        self.forecasts: dict[str, list[float]] = {}
        #: Each role's last input-length forecast (tokens): steadier than one window's mean.
        self.isl_forecasts: dict[str, float] = {}
        #: Each role's load passes so far, and the pass at which it last grew.
        self.passes: dict[str, int] = {name: 0 for name in config.roles}
        self.grew_at: dict[str, int] = {}
        #: Each role's last throughput pass: its demand forecast (req/s), the forecast's
        #: trend (req/s per throughput interval), the capacity a replica (req/s) and the
        #: load pass it followed.
        self.last_pass: dict[str, tuple[float, float, float, int]] = {}
        #: Load passes in one throughput interval, rounded up.
        self.passes_per_interval = math.ceil(config.intervals.throughput_s / config.intervals.load_s - 1e-9)
        #: Each role's last scale-down by the load loop: the replicas it had before, and the
        #: load pass that made it (its window's rate and those since are in ``recent_rates``).
        self.shrank_from: dict[str, tuple[int, int]] = {}
        #: Each role's per-replica load that a fleet the load loop shrank could not carry (it
        #: grew back on a backlog), as a fraction of the profile's capacity then, and the
        #: demand (req/s) it failed at (``_learn``).
        self.ceilings: dict[str, tuple[float, float]] = {}
        #: Each role's load-window request rates over its last ``FALLING_FORECASTS``
        #: throughput intervals, with their load pass, the latest last: the level of a
        #: demand that does not fall, and what a scale-down undone by a backlog failed at.
        self.recent_rates: dict[str, deque[tuple[int, float]]] = {
            name: deque(maxlen=FALLING_FORECASTS * self.passes_per_interval) for name in config.roles
        }

    def _limits(self, role: str) -> tuple[float | None, float | None]:
        """The (TTFT, ITL) targets a role answers for: prefill the first, decode the second."""
        t = self.config.targets
        return (None if role == "decode" else t.ttft.ms, None if role == "prefill" else t.itl.ms)

    def _constrain(self, role: str, target: int, fleet: Mapping[str, RoleState]) -> tuple[int, str]:
        spec: RoleConfig = self.config.roles[role]
        why = ""
        if target > spec.max_replicas:
            target, why = spec.max_replicas, f"; capped at max_replicas {spec.max_replicas}"
        budget = self.config.gpu_budget
        if budget is not None and spec.gpus_per_replica > 0:
            others = sum(
                state.total * self.config.roles[name].gpus_per_replica for name, state in fleet.items() if name != role
            )
            affordable = math.floor((budget - others) / spec.gpus_per_replica + 1e-9)
            if target > affordable:
                target, why = max(affordable, 0), f"; capped by gpu_budget {budget:g}"
        if target < spec.min_replicas:
            target, why = spec.min_replicas, f"; raised to min_replicas {spec.min_replicas}"
        return target, why

    def throughput(
        self,
        role: str,
        fleet: Mapping[str, RoleState],
        predicted_rate: float | None,
        predicted_isl: float | None,
        missing: tuple[str, ...] = (),
        trend: float = 0.0,
        quiet: bool = False,
    ) -> Decision:
        """The throughput loop's pass for ``role``: set its floor, raise the fleet to it.
        ``trend``: how much the forecast moves in one throughput interval (req/s; 0 for a
        predictor without a trend), which the load passes until the next one follow on a fall.
        ``quiet``: nothing arrived or waited over the role's last load window
        (``Observation.quiet``): the floor is set, not raised to (a forecast lags a load
        that stopped, and a raise in a lull is as likely undone)."""
        current = fleet[role].total
        if predicted_rate is None or predicted_isl is None:
            pairs = (("request_rate", predicted_rate), ("isl", predicted_isl))
            gone = missing or tuple(name for name, value in pairs if value is None)
            return Decision(role, "throughput", current, current, "hold: no demand forecast", gone)
        self.forecasts[role] = [*self.forecasts.get(role, [])[1 - FALLING_FORECASTS:], predicted_rate]
        self.isl_forecasts[role] = predicted_isl
        if self.model is None:
            return Decision(role, "throughput", current, current, "hold: no profile (the load loop sizes alone)")
        capacity = self.model.capacity(predicted_isl, *self._limits(role))
        spec = self.config.roles[role]
        if capacity <= 0:
            floor, why = spec.max_replicas, "the profile meets the targets at no concurrency"
        else:
            floor = math.ceil(predicted_rate / capacity - 1e-9)
            why = f"forecast {predicted_rate:.2f} req/s ÷ {capacity:.2f} req/s per replica"
        floor, capped = self._constrain(role, floor, fleet)
        self.floors[role] = floor
        self.last_pass[role] = (predicted_rate, trend, capacity, self.passes[role])
        if floor > current and trend < 0 and self._falling(role):
            # The load loop shrank the fleet under the floor on a falling demand (at the
            # observed rate, or the forecast moved along its trend): raised again now, a
            # replica would start only to be removed on the way down.
            return Decision(
                role, "throughput", current, current,
                f"hold: floor {floor} ({why}{capped}), but the demand falls and {current} replica(s) carry it",
            )
        if floor > current and quiet:
            return Decision(
                role, "throughput", current, current,
                f"hold: floor {floor} ({why}{capped}), but nothing arrived or waited over the last window",
            )
        target = max(current, floor)
        if target > current:
            self.grew_at[role] = self.passes[role]
        return Decision(role, "throughput", current, target, f"floor {floor}: {why}{capped}")

    def _fits_with(self, role: str, ready: int, serving: int, obs: Observation, margin: float) -> tuple[bool, str]:
        """Whether ``serving`` replicas keep the role under the targets less ``margin``
        (``obs`` was seen with ``ready`` replicas serving)."""
        rate = obs.request_rate or 0.0
        idle = rate == 0 and obs.waiting == 0 and obs.waiting_for_workers == 0
        # With no replica left, requests in flight are demand too: the last one serves them,
        # pending to us or not (the frontend hands a worker started for a request at zero
        # that request once it registers, before its `/ready` says so).
        if idle and (serving > 0 or obs.inflight <= 0):
            return True, "no demand"
        if serving == 0:
            return False, "demand remains"
        keep = 1.0 - margin
        ttft, itl = self._limits(role)
        # The fleet as it is already misses the band, or holds work it has not started:
        # one replica fewer cannot do better, whatever the profile says of the rate.
        if obs.waiting > serving:
            return False, f"{obs.waiting} request(s) waiting"
        for name, observed, limit in (("TTFT", obs.ttft_ms, ttft), ("ITL", obs.itl_ms, itl)):
            if limit is not None and observed is not None and observed > limit * keep:
                return False, f"{name} {observed:.0f} ms already over {keep:.0%} of {limit:g} ms"
        if self.model is not None and obs.isl is not None:
            capacity = self.model.capacity(
                obs.isl, None if ttft is None else ttft * keep, None if itl is None else itl * keep
            )
            why = f"{rate / serving:.2f} req/s per replica vs {capacity:.2f} within {keep:.0%} of the targets"
            if rate / serving > capacity:
                return False, why
            if ttft is not None:
                # The profile's closed loop never queues: open-loop arrivals at an engine
                # that saturates wait for a slot, which its flat curve gives no band against.
                demand = self._demand(role, rate)
                q = self.config.targets.ttft.quantile
                queue = self.model.slot_wait(obs.isl, demand, serving, q)
                if queue is not None and queue[1] > 0 and sum(queue) > ttft * keep:
                    return False, (
                        f"at {demand:.2f} req/s, {serving} replica(s)' slots queue: p{q * 100:g} wait "
                        f"{queue[1]:.0f} ms, TTFT {sum(queue):.0f} ms over {keep:.0%} of {ttft:g} ms"
                    )
            return True, why
        # No profile: latency taken to grow in proportion to the load per replica.
        scale = ready / serving
        for name, observed, limit in (("TTFT", obs.ttft_ms, ttft), ("ITL", obs.itl_ms, itl)):
            if limit is None:
                continue
            if observed is None:
                return False, f"no {name} observed under load"
            if observed * scale > limit * keep:
                return False, f"{name} {observed * scale:.0f} ms predicted over {keep:.0%} of {limit:g} ms"
        return True, "observed latencies scaled to the smaller fleet stay under the margin"

    def _needed(self, role: str, obs: Observation) -> int | None:
        """Replicas the observed rate needs by the profile's capacity at the targets (at the
        throughput loop's input-length forecast once there is one: one window's mean of a
        heavy-tailed mix swings by several times), with the waiting requests served on top
        within one throughput interval (``None``: no profile, no rate or no input length)."""
        isl = self.isl_forecasts.get(role, obs.isl)
        if self.model is None or isl is None or not obs.request_rate:
            return None
        capacity = self.model.capacity(isl, *self._limits(role))
        if capacity <= 0:
            return self.config.roles[role].max_replicas
        demand = obs.request_rate + obs.waiting / self.config.intervals.throughput_s
        return math.ceil(demand / capacity - 1e-9)

    def urgent(
        self,
        role: str,
        fleet: Mapping[str, RoleState],
        rate: float,
        isl: float | None,
        waiting: int,
        growth: float,
    ) -> Decision | None:
        """The urgent check between load passes for ``role``: ``waiting`` requests in its
        workers' queues, growing by ``growth`` a second, at the last load pass's ``rate``.
        When more wait than replicas are ready, the demand is taken as what the ready
        replicas serve plus the growth (what arrives and is not served), and the fleet
        raised to what it needs by the profile's capacity, the backlog served within one
        throughput interval (as the load loop sizes a backlog). While a queue builds, the
        ready replicas serve at least their capacity, whatever the last window's rate was
        (a step that follows a quiet window arrives at their capacity plus the growth, not
        at the old rate plus it). ``None``: nothing to do (no backlog, no profile, or the
        fleet, pending replicas counted, already carries it)."""
        state = fleet[role]
        if self.model is None or state.ready == 0 or waiting <= state.ready:
            return None
        length = self.isl_forecasts.get(role, isl)
        served = rate if length is None else max(rate, state.ready * self.model.capacity(length, *self._limits(role)))
        obs = Observation(request_rate=served + growth, isl=isl, ttft_ms=None, itl_ms=None, waiting=waiting)
        needed = self._warm(self._needed(role, obs), state.ready)
        if needed is None or needed <= state.total:
            return None
        target, capped = self._constrain(role, needed, fleet)
        if target <= state.total:
            return None
        self.grew_at[role] = self.passes[role]
        self.fits_in_a_row[role] = 0
        self._learn(role, target, isl)
        return Decision(
            role, "urgent", state.total, target,
            f"{waiting} request(s) waiting on {state.ready} ready replica(s), growing {growth:.1f}/s, at "
            f"{served:.2f} req/s served: {needed} replica(s) by the profile{capped}",
        )

    def _warm(self, needed: int | None, ready: int) -> int | None:
        """``needed`` replicas with those added beyond the ``ready`` ones counted at their
        warm-up speed (``warmup_speed``): what carries the load while they warm up."""
        if needed is None or needed <= ready:
            return needed
        return ready + math.ceil((needed - ready) / self.config.warmup_speed - 1e-9)

    def _falling(self, role: str) -> bool:
        """Whether each of the role's last ``FALLING_FORECASTS`` demand forecasts fell, and
        by more in all than the noise of one throughput window at the first of them."""
        forecasts = self.forecasts.get(role, [])
        if len(forecasts) < FALLING_FORECASTS:
            return False
        noise = FALL_NOISE_SIGMAS * math.sqrt(forecasts[0] / self.config.intervals.throughput_s)
        return forecasts[0] - forecasts[-1] > noise and all(
            later < earlier for earlier, later in itertools.pairwise(forecasts)
        )

    def _fall_since_pass(self, role: str) -> tuple[int, float] | None:
        """On a falling demand (``_falling``) whose forecast has a falling trend: the floor
        and the forecast moved along that trend from the last throughput pass to this load
        pass, at most one throughput interval on (the floor never above the pass's own).
        ``None``: not falling, or no trend to follow."""
        last = self.last_pass.get(role)
        if last is None or not self._falling(role):
            return None
        rate, trend, capacity, at = last
        if trend >= 0 or capacity <= 0:
            return None
        intervals = self.config.intervals
        elapsed = min(1.0, (self.passes[role] - at) * intervals.load_s / intervals.throughput_s)
        rate = max(0.0, rate + trend * elapsed)
        floor = max(math.ceil(rate / capacity - 1e-9), self.config.roles[role].min_replicas)
        return min(floor, self.floors[role]), rate

    def count_pass(self) -> None:
        """Count a load pass of every role before its decisions (``load(counted=True)``):
        a throughput pass made at the same instant, before them, belongs to it."""
        for role in self.passes:
            self.passes[role] += 1

    def load(self, role: str, fleet: Mapping[str, RoleState], obs: Observation, counted: bool = False) -> Decision:
        """The load loop's pass for ``role``: up, -1 or hold (``counted``: the pass was
        counted already, ``count_pass``)."""
        if not counted:
            self.passes[role] += 1
        decision = self._load(role, fleet, obs)
        if obs.request_rate is not None:
            self.recent_rates[role].append((self.passes[role], obs.request_rate))
        if decision.change > 0:
            self.grew_at[role] = self.passes[role]
            if obs.waiting > fleet[role].ready > 0:  # a backlog: the fleet lacked throughput
                self._learn(role, decision.target, obs.isl)
        elif decision.change < 0:
            self.shrank_from[role] = (decision.current, self.passes[role])
        return decision

    def _demand(self, role: str, rate: float) -> float:
        """The demand a scale-down is judged at beyond the profile's capacity (the queue at
        the slots, a learned ceiling): on a fall, ``rate`` (the rate the falling rule
        judges at); else the highest of one window's ``rate``, the latest throughput
        forecast, and the mean rate of the load windows over the span the falling rule
        watches (``FALLING_FORECASTS`` throughput intervals) plus one standard deviation
        of Poisson arrivals over it. A window of a few seconds swings by tens of percent,
        and so does one forecast's fall from the one before (a trend model amplifies a
        window's noise); a demand that is not falling is at its level over that span, and
        a window and a forecast that both read low by chance once let a saturated fleet
        shrink to a size whose slots queue."""
        forecasts = self.forecasts.get(role)
        if self._falling(role) or not forecasts:
            return rate
        recent = [r for _, r in self.recent_rates[role]]
        if not recent:
            return max(rate, forecasts[-1])
        # A demand that does not fall is judged at its level over the span the falling
        # rule watches, one standard deviation of Poisson arrivals over that span up.
        level = sum(recent) / len(recent)
        level += math.sqrt(level / (len(recent) * self.config.intervals.load_s))
        return max(rate, forecasts[-1], level)

    def _learn(self, role: str, target: int, isl: float | None) -> None:
        """The fleet grows to ``target`` on a backlog (more requests waiting than ready
        replicas: a quantile over its target alone may be one long request's own). When
        that undoes the load loop's last scale-down, the fleet it shrank to could not carry
        the demand, whatever the profile said: the mean rate of the load windows from the
        scale-down's to the backlog's, at most one throughput interval's (the first reads
        low, or it would not have allowed the scale-down, and the last high).

        A profile swept in a closed loop overstates a replica whose throughput has
        saturated: requests that arrive open-loop queue there without bound, and a latency
        margin gives no rate band on a flat throughput curve, so a constant load flaps. The
        per-replica load that failed, as a fraction of the profile's capacity, is the
        role's ceiling (``ceilings``), under which later scale-downs keep a replica's load
        by the margin while the demand stays within the margin of the one it was learned
        at (``_beyond_ceiling``: what one load showed says little of another, where the engine's
        batches differ). Only an overstatement within ``scale_down_margin`` is learned: a
        backlog at a lower load is a burst of long requests (a heavy-tailed mix), not a
        capacity the profile got wrong."""
        before, at = self.shrank_from.pop(role, (0, self.passes[role] + 1))
        # From the window that allowed it (one that reads low, as the one that shows the
        # backlog reads high), at most one throughput interval's.
        rates = [r for p, r in self.recent_rates[role] if p >= at][-self.passes_per_interval:]
        isl = self.isl_forecasts.get(role, isl)
        if target < before or before < 2 or not rates or self.model is None or isl is None:
            return
        demand = sum(rates) / len(rates)
        capacity = self.model.capacity(isl, *self._limits(role))
        if capacity <= 0:
            return
        fraction = demand / (before - 1) / capacity
        if 1.0 - self.config.scale_down_margin <= fraction < 1.0:
            self.ceilings[role] = (fraction, demand)

    def _cooling(self, role: str) -> int:
        """Load passes left before ``role`` may shrink after growing: more than one
        throughput interval (a replica asked for is not taken back before a forecast
        after the one that asked for it). 0: it may."""
        grew = self.grew_at.get(role)
        if grew is None:
            return 0
        return max(0, grew + self.passes_per_interval + 1 - self.passes[role])

    def _load(self, role: str, fleet: Mapping[str, RoleState], obs: Observation) -> Decision:
        """One load pass: the cases that decide alone (under ``min_replicas``, signals
        missing, no replicas, a load that stopped), then growth (``_grow``), then a
        scale-down (``_shrink``)."""
        state = fleet[role]
        current = state.total
        least = self.config.roles[role].min_replicas
        if current < least:
            target, capped = self._constrain(role, least, fleet)
            return Decision(role, "load", current, target, f"below min_replicas {least}{capped}")
        self.quiet_in_a_row[role] = self.quiet_in_a_row[role] + 1 if obs.quiet else 0
        if obs.missing:
            return Decision(role, "load", current, current, "hold: signals missing or stale", obs.missing)
        if current == 0:
            if not obs.demand:
                return Decision(role, "load", 0, 0, "hold: no replicas and no demand")
            target, capped = self._constrain(role, 1, fleet)
            return Decision(role, "load", 0, target, f"demand at zero replicas: start one{capped}")
        busy = max(least, math.ceil(obs.inflight - 1e-9))
        if self.quiet_in_a_row[role] >= QUIET_WINDOWS and busy < current:
            # The load stopped: whatever the floor or a recent growth, no replica is needed
            # beyond one for each request still in flight (the connector drains the least
            # busy first), and the next arrival is the load loop's to size.
            self.fits_in_a_row[role] = self.over_in_a_row[role] = 0
            target, capped = self._constrain(role, busy, fleet)
            return Decision(
                role, "load", current, target,
                f"nothing arrived or waited for {self.quiet_in_a_row[role]} windows: down to "
                f"{target} ({obs.inflight:.0f} request(s) in flight, min_replicas {least}){capped}",
            )
        grown = self._grow(role, fleet, obs)
        return grown if grown is not None else self._shrink(role, fleet, obs)

    def _grow(self, role: str, fleet: Mapping[str, RoleState], obs: Observation) -> Decision | None:
        """Growth: in proportion to what the rate and the backlog need by the profile, when
        the fleet is over a target or holds a backlog; else one replica when a quantile is
        over its target, unless more would not help (the holds below). ``None``: no quantile
        is over its target and no backlog needs more replicas, so a scale-down is judged."""
        state = fleet[role]
        current = state.total
        t = self.config.targets
        ttft, itl = self._limits(role)
        over = [
            f"p{q * 100:g} {name} {observed:.0f} ms > {limit:g} ms"
            for name, observed, limit, q in (
                ("TTFT", obs.ttft_ms, ttft, t.ttft.quantile),
                ("ITL", obs.itl_ms, itl, t.itl.quantile),
            )
            if limit is not None and observed is not None and observed > limit
        ]
        waited, self.last_waiting[role] = self.last_waiting.get(role), obs.waiting
        needed = self._needed(role, obs)
        backlog = obs.waiting > state.ready
        if (over or backlog) and needed is not None and needed > current:
            self.fits_in_a_row[role] = 0
            target, capped = self._constrain(role, needed, fleet)
            why = "; ".join(over) or f"{obs.waiting} request(s) waiting"
            return Decision(
                role, "load", current, target,
                f"{why}; {obs.request_rate:.2f} req/s and {obs.waiting} waiting need {needed} replica(s) "
                f"by the profile{capped}",
            )
        self.over_in_a_row[role] = self.over_in_a_row[role] + 1 if over else 0
        if not over:
            return None
        self.fits_in_a_row[role] = 0
        if not obs.demand:
            # The quantiles are of requests that arrived before: with nothing arriving
            # or waiting, a replica added would have nothing to serve.
            return Decision(role, "load", current, current, f"hold: {over[0]}, but nothing arrived or waits")
        if self.over_in_a_row[role] < self.config.scale_up_windows:
            return Decision(
                role, "load", current, current,
                f"hold: {over[0]}, {self.over_in_a_row[role]} of {self.config.scale_up_windows} passes in a row",
            )
        if state.pending:
            return Decision(role, "load", current, current, f"hold: {over[0]}; {state.pending} replica(s) starting")
        if needed is not None and current >= 2 * needed:
            return Decision(
                role, "load", current, current,
                f"hold: {over[0]}, but {current} replica(s) are twice or more what {obs.request_rate:.2f} req/s "
                f"needs by the profile ({needed}): more would not shorten a request",
            )
        if needed is not None and waited is not None and obs.waiting < waited:
            return Decision(
                role, "load", current, current,
                f"hold: {over[0]}; the backlog drains ({waited} -> {obs.waiting} waiting) "
                f"and {current} replica(s) carry {obs.request_rate:.2f} req/s by the profile",
            )
        target, capped = self._constrain(role, current + 1, fleet)
        return Decision(role, "load", current, target, f"{'; '.join(over)}{capped}")

    def _shrink(self, role: str, fleet: Mapping[str, RoleState], obs: Observation) -> Decision:
        """A scale-down by one replica, or a hold saying why not: the floor, the fleet
        with one fewer predicted against the targets less the margin (``_fits_with``), a
        learned ceiling (``_beyond_ceiling``), a recent growth or a rising forecast, and
        ``scale_down_windows`` passes in a row (not on a fall)."""
        state = fleet[role]
        current = state.total
        floor = max(self.floors[role], self.config.roles[role].min_replicas)
        fall = self._fall_since_pass(role)
        if fall is not None:
            floor = fall[0]
        if current - 1 < floor:
            self.fits_in_a_row[role] = 0
            return Decision(role, "load", current, current, f"hold: at the floor ({floor})")
        # One fewer: a pending replica goes first, so the serving fleet shrinks only
        # when none is pending.
        serving = min(state.ready, current - 1)
        forecasts, margin = self.forecasts.get(role, []), self.config.scale_down_margin
        if self._falling(role) and obs.request_rate:
            # A fall, not noise around a constant load: judge at the lower of the load seen
            # and the one forecast (moved along its trend since the pass), with half the hysteresis.
            forecast = forecasts[-1] if fall is None else fall[1]
            obs, margin = dataclasses.replace(obs, request_rate=min(obs.request_rate, forecast)), margin / 2
        fits, why = self._fits_with(role, state.ready, serving, obs, margin)
        if fits and why != "no demand":
            beyond = self._beyond_ceiling(role, obs, serving, margin)
            if beyond is not None:
                fits, why = False, beyond
        if not fits:
            self.fits_in_a_row[role] = 0
            return Decision(role, "load", current, current, f"hold: {current - 1} replica(s) would not do ({why})")
        if why != "no demand":
            cooling = self._cooling(role)
            late = f"the role grew {cooling} pass(es) too recently" if cooling else ""
            # Rising, and the load has not fallen back under the earlier forecast since.
            if len(forecasts) >= 2 and forecasts[-1] > forecasts[-2] and (obs.request_rate or 0.0) >= forecasts[-2]:
                late = f"the forecast rises ({forecasts[-2]:.2f} -> {forecasts[-1]:.2f} req/s)"
            if late:
                self.fits_in_a_row[role] = 0
                why = f"hold: {current - 1} replica(s) would do ({why}), but {late}"
                return Decision(role, "load", current, current, why)
        self.fits_in_a_row[role] += 1
        in_a_row = self.config.scale_down_windows
        if not state.pending and not self._falling(role) and self.fits_in_a_row[role] < in_a_row:
            return Decision(
                role, "load", current, current,
                f"hold: {current - 1} replica(s) would do ({why}), "
                f"{self.fits_in_a_row[role]} of {in_a_row} passes in a row",
            )
        self.fits_in_a_row[role] = 0
        target, capped = self._constrain(role, current - 1, fleet)
        return Decision(role, "load", current, target, f"{current - 1} replica(s) suffice ({why}){capped}")

    def _beyond_ceiling(self, role: str, obs: Observation, serving: int, margin: float) -> str | None:
        """Why ``serving`` replicas would each carry more than ``margin`` under the role's
        learned ceiling (``_learn``) at the demand (``_demand``), or ``None``: no ceiling
        applies. A ceiling learned at a demand more than ``scale_down_margin`` away from
        this one is forgotten."""
        learned = self.ceilings.get(role)
        if learned is None or self.model is None or not obs.isl or not serving:
            return None
        demand = self._demand(role, obs.request_rate or 0.0)
        fraction, at = learned
        ceiling = fraction * self.model.capacity(self.isl_forecasts.get(role, obs.isl), *self._limits(role))
        if abs(demand - at) > self.config.scale_down_margin * at:
            del self.ceilings[role]  # the demand moved away from where it was learned
            return None
        if demand / serving > (1.0 - margin) * ceiling:
            return (
                f"{demand / serving:.2f} req/s per replica vs {(1.0 - margin) * ceiling:.2f}, {margin:.0%} under "
                f"the {ceiling:.2f} that a replica of a fleet shrunk before could not carry"
            )
        return None

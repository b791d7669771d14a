"""The planning step: from one window of observations to the decisions, with no I/O and
no clock of its own. The live planner (``dynamo.planner.loop``) feeds it what it scraped
on wall-clock time; the planner lab (``dynamo.planner.lab``) what the simulated fleet did
on simulated time. One planner, two sources of time and signals.

``PlanningState.load_step`` is the load loop's pass (fold the window into the live
correction unless a replica is warming up or the fleet holds a backlog, then each
role's load decision); ``throughput_step`` the
throughput loop's (the windows' mean rate and input length into the predictors, then
each role's floor from the rate forecast for when a replica asked for now would serve:
the next interval plus the start-up time last seen, or the configured estimate before
one is seen, when that forecast is the higher); ``urgent_step`` the urgent check's
between load passes (a queue in the workers that rose at each of the last checks, by
more than the arrivals' own noise, while no replica is starting: the fleet raised at
once to what the profile says the backlog and its growth need, the replicas added
counted at their warm-up speed).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Mapping

from dynamo.planner.config import PlannerConfig
from dynamo.planner.decide import Decider, Decision, RoleState
from dynamo.planner.observe import FrontendWindow, observation
from dynamo.planner.predict import Predictor, make_predictor, trace_rates
from dynamo.planner.profile import Sample

log = logging.getLogger("dynamo.planner")

#: Urgent checks in a row at which the waiting requests must each have risen.
RISING_CHECKS = 3
#: Standard deviations of the arrivals' count over those checks by which the waiting
#: requests must have risen: under that, the rise is the noise of a fleet that keeps up.
QUEUE_NOISE_SIGMAS = 2.0


def expected_startup_s(config: PlannerConfig) -> float:
    """The start-up time assumed before one is seen: ``expected_startup_s`` when set,
    else the local connector's ``startup_delay_s`` (a floor: a process needs more), else 0."""
    if config.expected_startup_s is not None:
        return config.expected_startup_s
    return getattr(config.connector, "startup_delay_s", 0.0)


def warm_start_rates(config: PlannerConfig) -> list[float]:
    """The request rates (one per throughput interval) that warm the rate forecast up:
    ``predictor.warm_start_trace``'s, then ``predictor.warm_start``.

    Raises:
        OSError, ValueError: the trace cannot be read.
    """
    p = config.predictor
    warm = trace_rates(p.warm_start_trace, config.intervals.throughput_s) if p.warm_start_trace else []
    return [*warm, *p.warm_start]


class PlanningState:
    """The predictors, the windows since the last throughput pass and the fleet's history
    that the two loops share."""

    def __init__(self, config: PlannerConfig, decider: Decider) -> None:
        """Raises:
            OSError, ValueError: ``predictor.warm_start_trace`` cannot be read.
        """
        self.config = config
        self.decider = decider
        p = config.predictor
        warm = warm_start_rates(config)
        if p.kind == "holt_winters" and len(warm) % p.season:
            # The live windows continue the season where the warm start left it.
            log.warning(
                "predictor: the warm start holds %d intervals, not whole seasons of %d: the seasonal terms "
                "start %d interval(s) into a season, not at its start", len(warm), p.season, len(warm) % p.season,
            )
        params = p.model_dump(include={"window", "alpha", "beta", "gamma", "season", "phi"})
        self.rate_predictor: Predictor = make_predictor(p.kind, **params, warm_start=warm)
        self.isl_predictor: Predictor = make_predictor(p.kind, **params)
        self.windows: list[FrontendWindow] = []
        self.fleet: dict[str, RoleState] = {}
        #: When each role's ready count last rose (its youngest replica became ready).
        self.ready_rose_at: dict[str, float] = {}
        #: Since when each role has had a replica starting: when this planner asked for it,
        #: or else the pass that first saw it (one another actor started).
        self.pending_since: dict[str, float] = {}
        #: When each role was last raised by a decision of this planner's, and when the
        #: fleet was last noted (the decisions of a pass follow its note).
        self.asked_at: dict[str, float] = {}
        self.noted_at: float | None = None
        #: The start-up time last seen: from the ask (``pending_since``) to the pass that
        #: saw the replica ready (so to within one load interval over); before any, the
        #: configured estimate (``expected_startup_s``, or the local connector's delay).
        self.startup_s = expected_startup_s(config)
        #: The last load window's request rate, and the last mean input length a window
        #: had (the urgent check's: a window in which no request ended has none, and a
        #: step that follows a quiet window must still be sized).
        self.last_rate = 0.0
        self.last_isl: float | None = None
        #: Each role's last ``RISING_CHECKS + 1`` urgent checks: (when, waiting requests).
        self.urgent_seen: dict[str, list[tuple[float, int]]] = {}

    def note_fleet(self, fleet: Mapping[str, RoleState], now: float) -> None:
        """Record the fleet read at ``now`` (seconds, any monotonic clock)."""
        for role, state in fleet.items():
            before = self.fleet.get(role)
            if before is not None and state.ready > before.ready:
                self.ready_rose_at[role] = now
                if role in self.pending_since:
                    self.startup_s = now - self.pending_since[role]
            if state.pending == 0:
                self.pending_since.pop(role, None)
            elif role not in self.pending_since:
                # Asked for since the last note: it has been starting since the ask, not
                # since this pass saw it (up to one load interval later).
                asked = self.asked_at.get(role)
                fresh = asked is not None and self.noted_at is not None and self.noted_at <= asked <= now
                self.pending_since[role] = asked if fresh and asked is not None else now
        self.fleet = dict(fleet)
        self.noted_at = now

    def _asked(self, decisions: list[Decision], now: float | None) -> list[Decision]:
        """Note when each role was raised by ``decisions``, made at ``now``."""
        for d in decisions:
            if d.change > 0 and now is not None:
                self.asked_at[d.role] = now
        return decisions

    def youngest_age(self, now: float) -> float:
        """Seconds since the youngest ready replica became ready (infinite: none started)."""
        if not self.ready_rose_at:
            return float("inf")
        return now - max(self.ready_rose_at.values())

    def _correct(self, window: FrontendWindow, fleet: Mapping[str, RoleState], waiting: int, now: float) -> None:
        model = self.decider.model
        ready = sum(s.ready for s in fleet.values())
        if model is None or ready == 0 or window.isl is None or window.request_rate == 0:
            return
        sample = Sample(
            window.isl, window.inflight / ready, window.ttft_ms, window.itl_ms, self.youngest_age(now), waiting / ready,
        )
        model.correct(sample)

    def load_step(
        self,
        window: FrontendWindow | None,
        fleet: Mapping[str, RoleState],
        waiting: Mapping[str, int],
        missing: tuple[str, ...],
        now: float,
        throughput: bool = False,
    ) -> list[Decision]:
        """The load loop's decisions (one per role) for ``window`` (``None``: nothing
        scraped), the fleet, each role's waiting requests and the missing signals. With
        ``throughput`` (a throughput pass is due), the throughput loop's decisions come
        first, from the windows up to this one, and the load loop then judges the fleet
        they leave against the floors they set: a load pass that shrank the fleet under a
        floor the throughput pass raises at the same instant would have a replica drained
        and another started (and its start-up paid) for nothing. The caller acts on the
        decisions in order."""
        if window is not None:
            self.windows.append(window)
            self.last_rate = window.request_rate
            if window.isl is not None:
                self.last_isl = window.isl
            self._correct(window, fleet, sum(waiting.values()), now)
        self.decider.count_pass()
        observed = {role: observation(window, waiting.get(role, 0), missing) for role in self.config.roles}
        first: list[Decision] = []
        if throughput:
            first = self.throughput_step(fleet, quiet=frozenset(r for r, obs in observed.items() if obs.quiet))
            raised = {d.role: d.change for d in first if d.change > 0}
            fleet = {
                role: dataclasses.replace(state, pending=state.pending + raised.get(role, 0))
                for role, state in fleet.items()
            }
        return first + self._asked(
            [self.decider.load(role, fleet, obs, counted=True) for role, obs in observed.items()], now
        )

    def backlog(self, waiting: Mapping[str, int]) -> bool:
        """Whether any role holds more waiting requests than ready replicas by the fleet
        last noted: the cheap test before an urgent check reads the fleet again."""
        return any(w > self.fleet.get(role, RoleState(0)).ready for role, w in waiting.items())

    def urgent_step(self, fleet: Mapping[str, RoleState], waiting: Mapping[str, int], now: float) -> list[Decision]:
        """The urgent check's decisions (only the scale-ups; ``Decider.urgent``) from each
        role's waiting requests at ``now``: only when they rose at each of the last
        ``RISING_CHECKS`` checks, in all by ``QUEUE_NOISE_SIGMAS`` standard deviations of
        the arrivals' count over them at the last window's rate or more (a queue that
        builds, not one request too many for a moment, nor the waiting count of a busy
        fleet that keeps up) and no replica of the role is starting (one asked for
        already answers it; the next load pass sizes the fleet on a whole window). Their
        growth is the rise over those checks, a second."""
        decisions = []
        for role in self.config.roles:
            w = waiting.get(role, 0)
            seen = self.urgent_seen[role] = [*self.urgent_seen.get(role, [])[-RISING_CHECKS:], (now, w)]
            if role not in fleet or fleet[role].pending or len(seen) <= RISING_CHECKS:
                continue
            if not all(b[1] > a[1] for a, b in itertools.pairwise(seen)) or now <= seen[0][0]:
                continue
            # A rise the arrivals' own noise over those checks explains (a Poisson count's
            # standard deviation, at the last window's rate) is not a queue that builds.
            rise, span = w - seen[0][1], now - seen[0][0]
            if rise < QUEUE_NOISE_SIGMAS * math.sqrt(self.last_rate * span):
                continue
            growth = rise / span
            decision = self.decider.urgent(role, fleet, self.last_rate, self.last_isl, w, growth)
            if decision is not None:
                decisions.append(decision)
        return self._asked(decisions, now)

    def throughput_step(self, fleet: Mapping[str, RoleState], quiet: frozenset[str] = frozenset()) -> list[Decision]:
        """The throughput loop's decisions (one per role) from the windows since the last
        one; the ``quiet`` roles' floors (nothing arrived or waited over the last load
        window) are set but not raised to."""
        windows, self.windows = self.windows, []
        seconds = sum(w.seconds for w in windows)
        missing: tuple[str, ...] = ()
        if seconds > 0:
            self.rate_predictor.observe(sum(w.request_rate * w.seconds for w in windows) / seconds)
            isls = [w.isl for w in windows if w.isl is not None]
            if isls:
                self.isl_predictor.observe(sum(isls) / len(isls))
        else:
            missing = ("frontend_metrics",)
        # A replica asked for now serves from the next interval plus its start-up on:
        # the floor is the forecast for then when it is higher than the next interval's.
        ahead = 1.0 + self.startup_s / self.config.intervals.throughput_s
        rate = self.rate_predictor.predict()
        later = self.rate_predictor.predict(ahead)
        if rate is not None and later is not None:
            rate = max(rate, later)
        # How much that forecast moves in one interval (0 without a trend): the load passes
        # until the next throughput pass follow it on a fall.
        further = self.rate_predictor.predict(ahead + 1.0)
        trend = 0.0 if later is None or further is None else further - later
        isl = self.isl_predictor.predict()
        if rate is not None and isl is None and rate == 0:
            isl = 1.0  # no traffic yet: no input length, and none needed
        decisions = [
            self.decider.throughput(role, fleet, rate, isl, missing, trend, role in quiet)
            for role in self.config.roles
        ]
        return self._asked(decisions, self.noted_at)

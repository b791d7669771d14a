"""The planner's two loops over one fleet: observe → predict → decide → act.

``Planner.load_pass`` runs every ``intervals.load_s`` (scrape the frontend, read the
connector's replicas, then the load step), with the throughput step first at the first
pass at or after each ``intervals.throughput_s``; ``Planner.urgent_pass`` every
``intervals.urgent_s`` between them (the workers' waiting requests, scale-ups only).
The steps themselves, with no I/O, are ``dynamo.planner.step`` (the planner lab runs the
same ones on simulated time).
Each decision is logged and counted (``/metrics``); in ``advisory`` mode it is only logged
and shown on ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from typing import Any

from dynamo.planner.config import PlannerConfig
from dynamo.planner.connector import Connector, ConnectorError
from dynamo.planner.decide import Decider, Decision, RoleState
from dynamo.planner.metrics import render
from dynamo.planner.observe import FrontendObserver, LoadReports, SignalState
from dynamo.planner.step import PlanningState

log = logging.getLogger("dynamo.planner")

#: Decisions kept for ``/health``.
HISTORY = 50


class Planner:
    """One planner: its signals, its predictors, its decisions (see the module's docstring)."""

    def __init__(
        self,
        config: PlannerConfig,
        connector: Connector,
        frontend: FrontendObserver,
        decider: Decider,
        reports: dict[str, LoadReports] | None = None,
    ) -> None:
        self.config = config
        self.connector = connector
        self.frontend = frontend
        self.decider = decider
        self.reports = reports or {}
        self.state = PlanningState(config, decider)
        self.signals: dict[str, SignalState] = {"connector": SignalState("missing", "not read yet")}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        #: Decisions made per (role, loop, action), and changes that failed per role (``/metrics``).
        self.decision_counts: Counter[tuple[str, str, str]] = Counter()
        self.scale_failures: Counter[str] = Counter()
        self.started = time.monotonic()

    @property
    def fleet(self) -> dict[str, RoleState]:
        """The fleet as last read from the connector."""
        return self.state.fleet

    # -- observation -------------------------------------------------------------------

    def _set_signal(self, name: str, state: str, detail: str = "") -> None:
        old = self.signals.get(name)
        if old is None or (old.state, old.detail) != (state, detail):
            self.signals[name] = SignalState(state, detail)
            say = log.info if state == "ok" else log.warning
            say("signal %s: %s%s", name, state, f" ({detail})" if detail else "")

    async def _read_fleet(self) -> dict[str, RoleState] | None:
        try:
            fleet = await self.connector.replicas()
        except ConnectorError as e:
            self._set_signal("connector", "missing", f"{e.kind.value}: {e}")
            return None
        self._set_signal("connector", "ok")
        self.state.note_fleet(fleet, time.monotonic())
        return fleet

    def _report_signals(self, fleet: dict[str, RoleState]) -> None:
        now = time.monotonic()
        for role, reports in self.reports.items():
            fresh = len(reports.fresh(now))
            ready = fleet.get(role, RoleState(0)).ready
            if fresh >= ready or now - self.started < self.config.stale_after_s:
                self._set_signal(f"load_reports.{role}", "ok")
            else:
                state = "missing" if not reports.latest else "stale"
                self._set_signal(
                    f"load_reports.{role}", state,
                    f"{fresh} fresh report(s) for {ready} ready replica(s) (older than {self.config.stale_after_s:g}s)",
                )

    # -- the loops ---------------------------------------------------------------------

    async def load_pass(self, throughput: bool = False) -> list[Decision]:
        """One pass of the load loop, and with ``throughput`` the throughput loop's pass
        before its decisions (``PlanningState.load_step``); their decisions (one per role
        and loop, or none without a fleet)."""
        window = await self.frontend.scrape()
        self._set_signal("frontend_metrics", self.frontend.signal.state, self.frontend.signal.detail)
        fleet = await self._read_fleet()
        if fleet is None:
            log.warning("load loop: hold, the connector's fleet is unknown (%s)", self.signals["connector"].detail)
            return []
        self._report_signals(fleet)
        missing = tuple(name for name in ("frontend_metrics",) if self.signals[name].state != "ok")
        now = time.monotonic()
        waiting = {role: reports.waiting(now) for role, reports in self.reports.items()}
        if window is not None and window.held_busy:
            # Held at the frontend while every worker was busy: the backlog of the role
            # that takes arrivals, as if it waited in its workers' queues.
            arrivals = "decode" if "decode" in self.config.roles else "agg"
            waiting[arrivals] = waiting.get(arrivals, 0) + window.held_busy
        decisions = self.state.load_step(window, fleet, waiting, missing, now, throughput)
        for decision in decisions:
            await self._act(decision, fleet)
        return decisions

    async def urgent_pass(self) -> list[Decision]:
        """One urgent check between load passes (``intervals.urgent_s``): the workers'
        waiting requests from their load reports, already in memory; the fleet is read
        from the connector again only when they exceed its ready replicas. Its decisions
        are scale-ups only (``PlanningState.urgent_step``)."""
        now = time.monotonic()
        waiting = {role: reports.waiting(now) for role, reports in self.reports.items()}
        fleet: dict[str, RoleState] | None = self.state.fleet
        if self.state.backlog(waiting):
            fleet = await self._read_fleet()
            # The decisions follow that read's note: an ask before it would not count
            # as this planner's (``PlanningState.note_fleet``).
            now = time.monotonic()
        if not fleet:
            return []
        decisions = self.state.urgent_step(fleet, waiting, now)
        for decision in decisions:
            await self._act(decision, fleet)
        return decisions

    async def _act(self, decision: Decision, fleet: dict[str, RoleState]) -> None:
        missing = f" [missing: {', '.join(decision.missing)}]" if decision.missing else ""
        ready = fleet[decision.role].ready
        # Pending from the decision's own count: a load decision after a throughput raise
        # in the same pass counts the replicas that raise asked for, which the read did not.
        log.info(
            "%s loop: %s %s %d -> %d (ready %d, pending %d): %s%s",
            decision.loop, decision.role, decision.action, decision.current, decision.target,
            ready, decision.current - ready, decision.reason, missing,
        )
        entry: dict[str, Any] = {
            "at": time.time(), "loop": decision.loop, "role": decision.role, "action": decision.action,
            "current": decision.current, "target": decision.target, "reason": decision.reason,
            "missing": list(decision.missing), "done": False,
        }
        self.decisions.append(entry)
        self.decision_counts[(decision.role, decision.loop, decision.action)] += 1
        if decision.change == 0 or self.config.advisory:
            return
        try:
            await self.connector.scale(decision.role, decision.target, decision.reason)
            entry["done"] = True
        except ConnectorError as e:
            entry["error"] = str(e)
            self.scale_failures[decision.role] += 1
            self._set_signal("connector", "missing", f"{e.kind.value}: {e}")
            log.error("%s: scaling to %d failed: %s", decision.role, decision.target, e)

    async def run(self, stop: asyncio.Event) -> None:
        """The loops until ``stop`` is set; each pass is awaited before the next. The
        throughput loop's passes ride on the load loop's: the first load pass at or after
        each ``intervals.throughput_s`` makes one (the first pass too)."""
        intervals = self.config.intervals
        next_throughput = time.monotonic()

        async def load_and_throughput() -> None:
            nonlocal next_throughput
            due = time.monotonic() >= next_throughput
            if due:
                next_throughput = max(next_throughput + intervals.throughput_s, time.monotonic())
            await self.load_pass(throughput=due)

        async def every(seconds: float, one_pass: Any) -> None:
            while not stop.is_set():
                await one_pass()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), seconds)

        loops = [asyncio.create_task(every(intervals.load_s, load_and_throughput))]
        urgent_s = self.config.intervals.urgent_s
        if urgent_s is not None and self.reports and self.decider.model is not None:
            loops.append(asyncio.create_task(every(urgent_s, self.urgent_pass)))
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

    def metrics(self) -> bytes:
        """What ``/metrics`` shows (``dynamo.planner.metrics``)."""
        return render(self)

    def health(self) -> dict[str, Any]:
        """What ``/health`` shows."""
        now = time.monotonic()
        bad = {name: s for name, s in self.signals.items() if s.state != "ok"}
        model = self.decider.model
        return {
            "status": "ok" if not bad else "degraded",
            "advisory": self.config.advisory,
            "signals": {name: s.as_dict(now) for name, s in self.signals.items()},
            "fleet": {role: {"ready": s.ready, "pending": s.pending} for role, s in self.fleet.items()},
            "load": {role: reports.load(now).as_dict() for role, reports in self.reports.items()},
            "floors": dict(self.decider.floors),
            "correction": None if model is None else {
                "ttft_factor": model.correction.ttft_factor, "itl_factor": model.correction.itl_factor,
                "used": model.correction.used, "excluded_warmup": model.correction.excluded_warmup,
                "excluded_backlog": model.correction.excluded_backlog,
            },
            "decisions": list(self.decisions)[-20:],
        }

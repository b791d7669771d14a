"""The planner's two loops over one fleet: observe → predict → decide → act.

``Planner.load_pass`` runs every ``intervals.load_s`` (scrape the frontend, read the
connector's replicas, correct the model with the window unless a worker is warming up,
the load loop's ±1); ``Planner.throughput_pass`` every ``intervals.throughput_s`` (feed
the window's mean rate and input length to the predictors, the throughput loop's floor).
Each decision is logged; in ``advisory`` mode it is only logged and shown on ``/health``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from typing import Any

from dynamo.planner.config import PlannerConfig
from dynamo.planner.connector import Connector, ConnectorError
from dynamo.planner.decide import Decider, Decision, RoleState
from dynamo.planner.observe import FrontendObserver, FrontendWindow, LoadReports, SignalState, observation
from dynamo.planner.predict import Predictor, make_predictor
from dynamo.planner.profile import Sample

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
        p = config.predictor
        self.rate_predictor: Predictor = make_predictor(
            p.kind, window=p.window, alpha=p.alpha, beta=p.beta, warm_start=p.warm_start
        )
        self.isl_predictor: Predictor = make_predictor(p.kind, window=p.window, alpha=p.alpha, beta=p.beta)
        self.windows: list[FrontendWindow] = []
        self.signals: dict[str, SignalState] = {"connector": SignalState("missing", "not read yet")}
        self.fleet: dict[str, RoleState] = {}
        self.decisions: deque[dict[str, Any]] = deque(maxlen=HISTORY)
        #: When each role's ready count last rose (its youngest replica became ready).
        self.ready_rose_at: dict[str, float] = {}
        self.started = time.monotonic()

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
        now = time.monotonic()
        for role, state in fleet.items():
            before = self.fleet.get(role)
            if before is not None and state.ready > before.ready:
                self.ready_rose_at[role] = now
        self.fleet = fleet
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

    def _youngest_age(self) -> float:
        if not self.ready_rose_at:
            return float("inf")
        return time.monotonic() - max(self.ready_rose_at.values())

    # -- the loops ---------------------------------------------------------------------

    async def load_pass(self) -> list[Decision]:
        """One pass of the load loop; its decisions (one per role, or none without a fleet)."""
        window = await self.frontend.scrape()
        self._set_signal("frontend_metrics", self.frontend.signal.state, self.frontend.signal.detail)
        fleet = await self._read_fleet()
        if fleet is None:
            log.warning("load loop: hold, the connector's fleet is unknown (%s)", self.signals["connector"].detail)
            return []
        self._report_signals(fleet)
        missing = tuple(name for name in ("frontend_metrics",) if self.signals[name].state != "ok")
        if window is not None:
            self.windows.append(window)
            self._correct(window, fleet)
        decisions = []
        for role in self.config.roles:
            waiting = self.reports[role].waiting(time.monotonic()) if role in self.reports else 0
            decision = self.decider.load(role, fleet, observation(window, waiting, missing))
            decisions.append(decision)
            await self._act(decision, fleet)
        return decisions

    def _correct(self, window: FrontendWindow, fleet: dict[str, RoleState]) -> None:
        model = self.decider.model
        ready = sum(s.ready for s in fleet.values())
        if model is None or ready == 0 or window.isl is None or window.request_rate == 0:
            return
        sample = Sample(window.isl, window.inflight / ready, window.ttft_ms, window.itl_ms, self._youngest_age())
        if not model.correct(sample):
            log.debug("live correction: sample left out (warm-up or nothing to compare)")

    async def throughput_pass(self) -> list[Decision]:
        """One pass of the throughput loop: forecast the next interval, set the floors."""
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
        fleet = await self._read_fleet()
        if fleet is None:
            return []
        rate, isl = self.rate_predictor.predict(), self.isl_predictor.predict()
        if rate is not None and isl is None and rate == 0:
            isl = 1.0  # no traffic yet: no input length, and none needed
        decisions = []
        for role in self.config.roles:
            decision = self.decider.throughput(role, fleet, rate, isl, missing)
            decisions.append(decision)
            await self._act(decision, fleet)
        return decisions

    async def _act(self, decision: Decision, fleet: dict[str, RoleState]) -> None:
        missing = f" [missing: {', '.join(decision.missing)}]" if decision.missing else ""
        state = fleet[decision.role]
        log.info(
            "%s loop: %s %s %d -> %d (ready %d, pending %d): %s%s",
            decision.loop, decision.role, decision.action, decision.current, decision.target,
            state.ready, state.pending, decision.reason, missing,
        )
        entry: dict[str, Any] = {
            "at": time.time(), "loop": decision.loop, "role": decision.role, "action": decision.action,
            "current": decision.current, "target": decision.target, "reason": decision.reason,
            "missing": list(decision.missing), "done": False,
        }
        self.decisions.append(entry)
        if decision.change == 0 or self.config.advisory:
            return
        try:
            await self.connector.scale(decision.role, decision.target, decision.reason)
            entry["done"] = True
        except ConnectorError as e:
            entry["error"] = str(e)
            self._set_signal("connector", "missing", f"{e.kind.value}: {e}")
            log.error("%s: scaling to %d failed: %s", decision.role, decision.target, e)

    async def run(self, stop: asyncio.Event) -> None:
        """Both loops until ``stop`` is set; each pass is awaited before the next."""

        async def every(seconds: float, one_pass: Any) -> None:
            while not stop.is_set():
                await one_pass()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), seconds)

        loops = [
            asyncio.create_task(every(self.config.intervals.load_s, self.load_pass)),
            asyncio.create_task(every(self.config.intervals.throughput_s, self.throughput_pass)),
        ]
        try:
            await asyncio.gather(*loops)
        finally:
            for task in loops:
                task.cancel()
            await asyncio.gather(*loops, return_exceptions=True)

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
            "floors": dict(self.decider.floors),
            "correction": None if model is None else {
                "ttft_factor": model.correction.ttft_factor, "itl_factor": model.correction.itl_factor,
                "used": model.correction.used, "excluded_warmup": model.correction.excluded_warmup,
            },
            "decisions": list(self.decisions)[-20:],
        }

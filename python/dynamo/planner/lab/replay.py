"""One configuration's replay: the workload through a simulated fleet, load window by
load window, with a planner's steps (``dynamo.planner.step.PlanningState``) resizing
it as the live planner would, and the per-request outcomes and timeline it leaves
(``Run``)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo._core import PlannerLab
from dynamo.planner.decide import Decision, RoleState
from dynamo.planner.lab.engine import Fleet, simulated_fleet
from dynamo.planner.lab.settings import Settings
from dynamo.planner.lab.workload import Workload
from dynamo.planner.observe import FrontendWindow
from dynamo.planner.step import PlanningState


def quantile(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` by nearest rank (a value that occurred: a p90 that
    meets a target means 90 % of the requests did; ``sweep.quantile`` interpolates, for
    a profile's smooth curve); ``None`` for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0]


@dataclass
class Run:
    """One configuration's replay: per-request outcomes and the timeline."""

    config: str
    ttft: dict[int, float | None] = field(default_factory=dict)
    itl: dict[int, float | None] = field(default_factory=dict)
    #: Each finished request's send (arrival) time, s.
    sent: dict[int, float] = field(default_factory=dict)
    rejected: int = 0
    failed_at_scale_down: int = 0
    replica_seconds: float = 0.0
    #: Each role's replica changes, in order.
    changes: dict[str, list[int]] = field(default_factory=dict)
    #: Replica-seconds per role.
    role_seconds: dict[str, float] = field(default_factory=dict)
    #: Per load interval: replicas starting + ready per role.
    pools: list[dict[str, int]] = field(default_factory=list)
    #: Per load interval: (end s, replicas starting + ready, arrivals/s, p90 TTFT, p90 ITL) of
    #: the requests that ended in it (the plot's; ``recovery_s`` counts by send time).
    timeline: list[tuple[float, int, float, float | None, float | None]] = field(default_factory=list)
    last_arrival_s: float = 0.0
    wall_s: float = 0.0
    #: Load windows the live correction left out because a replica was warming up.
    excluded_warmup: int = 0
    #: Load windows it left out because the fleet held a backlog.
    excluded_backlog: int = 0
    #: Disaggregated: prefills queued for the prefill pool (``remote``), run by the
    #: decode replicas (``local``, by the rule or given up), and given up because their
    #: KV had not landed within the remote prefill timeout (``fallback``).
    prefills: dict[str, int] = field(default_factory=lambda: {"remote": 0, "local": 0, "fallback": 0})


def _fleet(lab: PlannerLab) -> dict[str, RoleState]:
    """Each role's replicas as a connector would report them."""
    fleet = {}
    for role in lab.roles:
        starting, ready, _ = lab.counts(role)
        fleet[role] = RoleState(ready=ready, pending=starting)
    return fleet


def _waiting(window: dict[str, Any], roles: Sequence[str]) -> dict[str, int]:
    """Each role's waiting requests at the end of ``window``: the queue before its pool
    (the frontend's before the aggregated or decode replicas, the shared prefill queue
    before the prefill replicas) and its replicas' engine queues."""
    waiting: dict[str, int] = {}
    for r in window["replicas"]:
        waiting[r["role"]] = waiting.get(r["role"], 0) + r["waiting"]
    if "agg" not in roles:
        return {
            "prefill": window["prefill_queue"] + waiting.get("prefill", 0),
            "decode": window["frontend_queue"] + waiting.get("decode", 0),
        }
    return {"agg": window["frontend_queue"] + waiting.get("agg", 0)}


#: Load intervals a planner's replay runs on after its last request for the fleet to get
#: back to its minimum (``to_min_s``: none if it does not).
TAIL_LOAD_INTERVALS = 30


def replay(
    workload: Workload, settings: Settings, replicas: Fleet, state: PlanningState | None, name: str,
) -> Run:
    """Replay ``workload`` from ``replicas`` replicas (a count per role when
    disaggregated); with ``state``, its load and throughput steps resize the fleet at
    every interval, as the live planner would."""
    started = time.perf_counter()
    config = settings.config
    targets = config.targets
    load_s, throughput_s = config.intervals.load_s, config.intervals.throughput_s
    lab = simulated_fleet(workload, replicas, settings)
    run = Run(name, last_arrival_s=lab.last_arrival_s)
    t, next_throughput = 0.0, throughput_s
    # A planner's replay goes on after the last request (the tail) until its fleet is back
    # at the minimum (its replicas cost until then; ``to_min_s``), for at most
    # TAIL_LOAD_INTERVALS. The tail's changes count in the GPU time, not in the scale events.
    ended: float | None = None

    def act(decisions: list[Decision]) -> None:
        for d in decisions:
            if d.change and not config.advisory:
                lab.set_replicas(d.target, role=d.role)
                if ended is None:  # the tail's are not the workload's scale events
                    run.changes.setdefault(d.role, []).append(d.change)

    urgent_s = config.intervals.urgent_s if state is not None else None
    while True:
        if lab.done and t >= lab.last_arrival_s:
            ended = t if ended is None else ended
            if state is None or run.timeline[-1][1] <= settings.min_fleet or t >= ended + TAIL_LOAD_INTERVALS * load_s:
                break
        start, t = t, t + load_s
        w = _load_window(lab, start, t, urgent_s, state, act)
        run.rejected += w["rejected"]
        run.failed_at_scale_down += w["failed_at_scale_down"]
        for kind in run.prefills:
            run.prefills[kind] += w[f"{kind}_prefills"]
        f = w["finished"]
        run.ttft.update(zip(f["index"], f["ttft_ms"], strict=True))
        run.itl.update(zip(f["index"], f["itl_ms"], strict=True))
        run.sent.update(zip(f["index"], f["arrival_s"], strict=True))
        ttfts = [x for x in f["ttft_ms"] if x is not None]
        itls = [x for x in f["itl_ms"] if x is not None]
        ttft_q, itl_q = quantile(ttfts, targets.ttft.quantile), quantile(itls, targets.itl.quantile)
        fleet = _fleet(lab)
        run.pools.append({role: s.total for role, s in fleet.items()})
        run.timeline.append((t, sum(run.pools[-1].values()), w["arrivals"] / load_s, ttft_q, itl_q))
        if state is None:
            continue
        window = FrontendWindow(
            seconds=load_s, request_rate=w["arrivals"] / load_s, inflight=w["inflight"],
            isl=w["arrival_input_tokens"] / w["arrivals"] if w["arrivals"] else None, osl=None,
            ttft_ms=ttft_q, itl_ms=itl_q,
        )
        due = t >= next_throughput - 1e-9
        if due:
            next_throughput += throughput_s
        state.note_fleet(fleet, t)
        act(state.load_step(window, fleet, _waiting(w, lab.roles), (), t, throughput=due))
        if t > lab.last_arrival_s + 24 * 3600:
            raise RuntimeError(f"{name}: the replay does not end")
    run.replica_seconds = lab.replica_seconds
    run.role_seconds = lab.role_seconds
    run.wall_s = time.perf_counter() - started
    return run


def _merge(window: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Two consecutive windows of ``PlannerLab.advance`` as one: the counts summed, the
    finished requests in order, the state at the end the later one's."""
    merged = dict(later)
    for key in ("arrivals", "arrival_input_tokens", "rejected", "failed_at_scale_down", "remote_prefills",
                "local_prefills", "fallback_prefills"):
        merged[key] = window[key] + later[key]
    merged["finished"] = {k: [*window["finished"][k], *later["finished"][k]] for k in later["finished"]}
    return merged


def _load_window(
    lab: PlannerLab, start: float, end: float, urgent_s: float | None, state: PlanningState | None,
    act: Callable[[list[Decision]], None],
) -> dict[str, Any]:
    """Advance ``lab`` from ``start`` to ``end`` (one load interval) and return the window;
    with ``urgent_s``, in steps of it, the urgent check made at each step before ``end``
    (as the live planner's urgent loop does between its load passes)."""
    if urgent_s is None or state is None:
        return lab.advance(end)
    window: dict[str, Any] | None = None
    u = start
    while u < end - 1e-9:
        u = min(u + urgent_s, end)
        part = lab.advance(u)
        window = part if window is None else _merge(window, part)
        if u < end - 1e-9:
            waiting = _waiting(part, lab.roles)
            fleet = state.fleet
            if state.backlog(waiting):
                fleet = _fleet(lab)
                state.note_fleet(fleet, u)
            act(state.urgent_step(fleet, waiting, u))
    assert window is not None
    return window

"""``python -m dynamo.planner.lab TRACE``: the planner lab. Replays an open-loop trace (a
Mooncake-format file, or ``ramp``: 2 → 20 → 2 req/s) through a simulated mocker fleet on
a virtual clock (``dynamo._core.PlannerLab``), with the planner's own steps
(``dynamo.planner.step``: the same predictors, performance model and ``Decider`` as
``python -m dynamo.planner``) resizing it every load and throughput interval, and
compares four configurations, one row each:

* ``static-peak``: the smallest fixed fleet whose p90 TTFT and ITL over the whole trace
  meet the targets (found by bisection over 1..``max_replicas``; disaggregated, the
  (prefill, decode) pair with the fewest GPUs that a coordinate search finds:
  ``static_peak_pair``);
* ``static-mean``: a fixed fleet sized for the mean rate by the performance model (each
  role by its own target, as the planner's ``Decider`` sizes it);
* ``load-only``: the planner without a profile (the load loop alone);
* ``planner``: both loops, with a profile of the simulated engine.

The profile is measured on the simulated engine itself (``planner_lab_point``: one
replica at a fixed concurrency, per input length) and cached, so no file is needed.
With roles ``prefill`` and ``decode`` the fleet is disaggregated (two pools, each
resized by the planner's decision for its role; docs/planner.md, "The lab"), and the
planner's model answers each role from a profile of a replica in that role
(``DisaggModel``).
Each request counts as *good* when its TTFT and its mean inter-token latency are within
the targets; figures per row are described in docs/planner.md ("The lab").
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo._core import PlannerLab, planner_lab_point
from dynamo.planner.config import ROLES_AGG, ROLES_DISAGG, PlannerConfig, PlannerConfigError, Targets, load_config
from dynamo.planner.decide import Decider, Decision, RoleState, count_reversals
from dynamo.planner.observe import FrontendWindow
from dynamo.planner.predict import rates_of
from dynamo.planner.profile import PerformanceModel, Profile, ProfilePoint, model_for
from dynamo.planner.step import PlanningState

CONFIGS = ("static-peak", "static-mean", "load-only", "planner")
#: A fixed fleet: replicas (aggregated), or replicas per role (disaggregated).
Fleet = int | Mapping[str, int]
#: The synthetic workloads, as (seconds, requests/s at the start, requests/s at the end)
#: segments, the rate linear within each. ``ramp``: 10 min at 2 req/s, a linear rise to
#: 20 over 5 min, 2 min at 20, a linear fall to 2 over 5 min, 10 min at 2 (32 min).
RAMP_PHASES = ((600.0, 2.0, 2.0), (300.0, 2.0, 20.0), (120.0, 20.0, 20.0), (300.0, 20.0, 2.0), (600.0, 2.0, 2.0))
#: ``step``: 5 min at 2 req/s, 5 min at 20, 5 min at 2 (the load step of ``recovery_s``).
STEP_PHASES = ((300.0, 2.0, 2.0), (300.0, 20.0, 20.0), (300.0, 2.0, 2.0))
SYNTHETIC = {"ramp": RAMP_PHASES, "step": STEP_PHASES}
#: Prompt and output tokens of every synthetic request.
RAMP_ISL, RAMP_OSL = 3072, 256
#: Concurrencies of the profile sweep.
PROFILE_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
#: A rise of the arrival rate by this factor from one throughput interval to the next
#: is a load step (for ``recovery_s``).
STEP_FACTOR = 1.5

COLUMNS = (
    ("config", "config", "{}"),
    ("replicas", "replicas", "{}"),
    ("SLA", "sla_attainment", "{:.3f}"),
    ("GPU h", "gpu_hours", "{:.3f}"),
    ("goodput/GPU h", "goodput_per_gpu", "{:.0f}"),
    ("vs peak", "vs_static_peak", "{:.2f}x"),
    ("TTFT p90 ms", "ttft_p90_ms", "{:.0f}"),
    ("ITL p90 ms", "itl_p90_ms", "{:.1f}"),
    ("scale events", "scale_events", "{}"),
    ("reversals", "reversals", "{}"),
    ("failed at down", "failed_at_scale_down", "{}"),
    ("recovery s", "recovery_s", "{:.0f}"),
    ("to min s", "to_min_s", "{:.0f}"),
)


@dataclass
class Workload:
    """What the fleet replays: a trace file or a list of (ms, input, output) requests."""

    name: str
    trace: Path | None = None
    requests: list[tuple[float, int, int]] | None = None
    #: Timestamps divided by this.
    time_scale: float = 1.0
    #: A synthetic workload's rate over time (``RAMP_PHASES``), for ``best_ratio``.
    phases: Sequence[tuple[float, float, float]] | None = None

    def lab(self, replicas: Fleet, settings: Settings) -> PlannerLab:
        """A fresh simulated fleet of ``replicas`` warm replicas (a count per role when
        disaggregated)."""
        pools: dict[str, Any] = {}
        if isinstance(replicas, int):
            pools["replicas"] = replicas
        else:
            pools.update(prefill_replicas=replicas["prefill"], decode_replicas=replicas["decode"])
            if settings.max_local_prefill_length is not None:
                pools["max_local_prefill_length"] = settings.max_local_prefill_length
        return PlannerLab(
            str(self.trace) if self.trace else None, self.requests, **pools,
            trace_block_size=settings.trace_block_size, time_scale=self.time_scale,
            startup_s=settings.startup_s, warmup_s=settings.warmup_s, warmup_factor=settings.warmup_factor,
            seed=settings.seed, engine_args=settings.engine_args, busy_threshold=settings.busy_threshold,
        )

    def trace_rows(self) -> list[dict[str, Any]]:
        """The requests as replayed, as Mooncake-format rows: their timestamps (ms)
        divided by the time scale; a synthetic request shares no prefix blocks."""
        if self.requests is not None:
            return [
                {"timestamp": t / self.time_scale, "input_length": i, "output_length": o, "hash_ids": []}
                for t, i, o in self.requests
            ]
        assert self.trace is not None
        with self.trace.open() as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        return [{**r, "timestamp": float(r["timestamp"]) / self.time_scale} for r in rows]

    def write_trace(self, path: Path) -> int:
        """Write the requests as replayed to ``path`` as a Mooncake-format trace (a
        ``predictor.warm_start_trace``, or a trace to replay); how many."""
        rows = self.trace_rows()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return len(rows)

    def rates(self, interval_s: float) -> list[float]:
        """Arrivals per second in each ``interval_s`` (time-scaled)."""
        return rates_of((r["timestamp"] / 1000.0 for r in self.trace_rows()), interval_s)

    def shape(self) -> tuple[float, float, float, list[int]]:
        """(duration s, mean input length, mean output length, input lengths)."""
        rows = [(r["timestamp"], int(r["input_length"]), int(r["output_length"])) for r in self.trace_rows()]
        if not rows:
            raise ValueError(f"{self.name}: no requests")
        duration = max(t for t, _, _ in rows) / 1000.0
        isls = [i for _, i, _ in rows]
        return duration, sum(isls) / len(isls), sum(o for _, _, o in rows) / len(rows), isls


def _rate_at(phases: Sequence[tuple[float, float, float]], t: float) -> float:
    start = 0.0
    for seconds, r0, r1 in phases:
        if t < start + seconds:
            return r0 + (r1 - r0) * (t - start) / seconds
        start += seconds
    return 0.0


def ramp(seed: int, phases: Sequence[tuple[float, float, float]] = RAMP_PHASES) -> list[tuple[float, int, int]]:
    """Open-loop Poisson arrivals whose rate follows ``phases`` (linear within each),
    seeded: (ms, input, output). Drawn at the highest rate and thinned to the rate at
    each instant (Lewis and Shedler), so a linear rise is a rise, not a staircase."""
    rng = random.Random(seed)
    top = max(max(r0, r1) for _, r0, r1 in phases)
    end = sum(seconds for seconds, _, _ in phases)
    requests, t = [], rng.expovariate(top)
    while t < end:
        if rng.random() * top < _rate_at(phases, t):
            requests.append((t * 1000.0, RAMP_ISL, RAMP_OSL))
        t += rng.expovariate(top)
    return requests


def best_ratio(phases: Sequence[tuple[float, float, float]], capacity: float) -> float:
    """The goodput-per-GPU ratio to static-peak that a perfect planner would reach on
    ``phases``: a fleet of ``ceil(rate / capacity)`` replicas at every instant (at least
    one, no start-up, no queue) against ``ceil(peak / capacity)`` for the whole time, the
    same requests served by both (integrated over 0.1 s steps)."""
    end = sum(seconds for seconds, _, _ in phases)
    top = max(max(r0, r1) for _, r0, r1 in phases)
    dt, oracle, t = 0.1, 0.0, 0.05
    while t < end:
        oracle += max(1, math.ceil(_rate_at(phases, t) / capacity - 1e-9)) * dt
        t += dt
    return math.ceil(top / capacity - 1e-9) * end / oracle


@dataclass
class Settings:
    """The lab's knobs (its command line)."""

    config: PlannerConfig
    startup_s: float = 30.0
    warmup_s: float = 10.0
    warmup_factor: float = 2.0
    seed: int = 0
    trace_block_size: int = 512
    engine_args: str | None = None
    cache_dir: Path | None = None
    #: Replicas ``load-only`` and ``planner`` start with (default: ``min_replicas``, at least 1).
    initial_replicas: int | None = None
    #: The router's busy threshold: arrivals wait at the frontend while every ready
    #: replica's KV demand is at or over this fraction (``None``: they queue on a replica).
    busy_threshold: float | None = None
    #: Disaggregated: a decode replica prefills remotely only a prompt whose uncached part
    #: is longer than this (``None``: the decode worker's default, 1000 tokens).
    max_local_prefill_length: int | None = None

    @property
    def ttft_ms(self) -> float:
        return self.config.targets.ttft.ms

    @property
    def itl_ms(self) -> float:
        return self.config.targets.itl.ms

    @property
    def max_replicas(self) -> int:
        return self.config.roles["agg"].max_replicas

    @property
    def disagg(self) -> bool:
        """Whether the roles are ``prefill`` and ``decode``."""
        return "agg" not in self.config.roles

    @property
    def roles(self) -> tuple[str, ...]:
        """``("agg",)`` or ``("prefill", "decode")``."""
        return ROLES_DISAGG if self.disagg else ROLES_AGG

    @property
    def min_fleet(self) -> int:
        """The replicas of every role at its ``min_replicas``."""
        return sum(self.config.roles[role].min_replicas for role in self.roles)

    def gpus(self, fleet: Mapping[str, int]) -> float:
        """GPUs a fleet of ``fleet`` replicas per role holds."""
        return sum(n * self.config.roles[role].gpus_per_replica for role, n in fleet.items())


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)] if q > 0 else ordered[0]


def profile_for(workload: Workload, settings: Settings, role: str = "agg") -> Profile:
    """The performance profile of one simulated replica of ``role`` over the workload's
    input lengths (its 10th, 50th and 90th percentiles) and mean output length, cached
    on disk (``planner_lab_point``: a prefill replica's requests are one token long, a
    decode replica's prompts arrive cached)."""
    _, _, osl, isls = workload.shape()
    ordered = sorted(isls)
    lengths = sorted({max(16, ordered[int(q * (len(ordered) - 1))]) for q in (0.1, 0.5, 0.9)})
    osl_i = max(2, round(osl))
    q = settings.config.targets.ttft.quantile
    parts: list[Any] = [1, settings.engine_args, lengths, osl_i, q, PROFILE_CONCURRENCY]
    if role != "agg":  # the aggregated profile's key as it was, so its cache entries stay valid
        parts.append(role)
    key = json.dumps(parts, sort_keys=True)
    cache = settings.cache_dir / f"profile-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json" \
        if settings.cache_dir else None
    if cache is not None and cache.exists():
        try:
            return Profile.model_validate_json(cache.read_text())
        except ValueError:
            pass  # a stale or broken cache entry: measure again
    points = []
    for isl in lengths:
        for c in PROFILE_CONCURRENCY:
            p = planner_lab_point(
                isl, osl_i, c, max(4 * c, 24), quantile=q, engine_args=settings.engine_args, role=role
            )
            points.append(ProfilePoint(isl=isl, concurrency=c, ttft_ms=p["ttft_ms"], itl_ms=p["itl_ms"],
                                       throughput_rps=p["throughput_rps"]))
    engine = "planner-lab mocker" if role == "agg" else f"planner-lab mocker, {role} replica"
    profile = Profile(engine=engine, role=role, quantile=q, osl=1 if role == "prefill" else osl_i, points=points)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        profile.save(cache)
    return profile


def profiles_for(workload: Workload, settings: Settings) -> dict[str, Profile]:
    """Each pool's profile: ``agg``'s, or ``prefill``'s and ``decode``'s."""
    return {role: profile_for(workload, settings, role) for role in settings.roles}


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


def _replay(
    workload: Workload, settings: Settings, replicas: Fleet, state: PlanningState | None, name: str,
) -> Run:
    """Replay ``workload`` from ``replicas`` replicas (a count per role when
    disaggregated); with ``state``, its load and throughput steps resize the fleet at
    every interval, as the live planner would."""
    started = time.perf_counter()
    config = settings.config
    targets = config.targets
    load_s, throughput_s = config.intervals.load_s, config.intervals.throughput_s
    lab = workload.lab(replicas, settings)
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
        ttft_q, itl_q = _quantile(ttfts, targets.ttft.quantile), _quantile(itls, targets.itl.quantile)
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


def _breaks(run: Run, indices: list[int], targets: Targets) -> bool:
    """Whether the requests ``indices`` break a target at its quantile (one that never
    got a first token counts as late)."""
    ttfts = [math.inf if run.ttft.get(i) is None else run.ttft[i] for i in indices]
    itls = [run.itl[i] for i in indices if run.itl.get(i) is not None]
    ttft_q, itl_q = _quantile(ttfts, targets.ttft.quantile), _quantile(itls, targets.itl.quantile)
    return (ttft_q is not None and ttft_q > targets.ttft.ms) or (itl_q is not None and itl_q > targets.itl.ms)


def _broken_after_s(run: Run, since: float, bin_s: float, targets: Targets) -> float:
    """From ``since`` to the end of the first run of ``bin_s`` bins of requests *sent*
    from then on that break a target (0: none breaks one), as ``benches/planner.py``
    measures it: a backlog served late after the fleet has grown does not hold up the
    requests sent since, which the fleet serves in time."""
    bins: dict[int, list[int]] = {}
    for i, sent in run.sent.items():
        if sent >= since:
            bins.setdefault(int((sent - since) // bin_s), []).append(i)
    broken = [_breaks(run, bins.get(b, []), targets) for b in range(max(bins) + 1)] if bins else []
    return first_broken_run_end(broken) * bin_s


def first_broken_run_end(broken: list[bool]) -> int:
    """Bins from the first to the end of the first run of broken ones (``True``), that
    first bin's predecessors included; 0 when none is broken."""
    first = next((b for b, x in enumerate(broken) if x), None)
    if first is None:
        return 0
    last = first
    while last < len(broken) and broken[last]:
        last += 1
    return last


def _recovery_s(run: Run, throughput_s: float, load_s: float, targets: Targets) -> float:
    """The longest time from a load step (the arrival rate over a throughput interval
    rising by ``STEP_FACTOR`` or more) until the requests sent after it meet the targets
    again (``_broken_after_s``, in load-interval bins)."""
    per = max(1, round(throughput_s / load_s))
    rates = [sum(r for _, _, r, _, _ in run.timeline[i:i + per]) / per for i in range(0, len(run.timeline), per)]
    worst = 0.0
    for k in range(1, len(rates)):
        if (rates[k - 1] > 0 and rates[k] >= STEP_FACTOR * rates[k - 1]) or rates[k - 1] == 0 < rates[k]:
            step_at = k * per * load_s
            worst = max(worst, _broken_after_s(run, step_at, load_s, targets))
    return worst


def _row(run: Run, settings: Settings) -> dict[str, Any]:
    targets = settings.config.targets
    total = len(run.ttft) + run.rejected
    good = sum(
        1 for i, ttft in run.ttft.items()
        if ttft is not None and ttft <= targets.ttft.ms and (run.itl[i] is None or run.itl[i] <= targets.itl.ms)
    )
    gpu_hours = sum(
        seconds * settings.config.roles[role].gpus_per_replica for role, seconds in run.role_seconds.items()
    ) / 3600.0
    # A timeline entry's fleet is the one over the load window that ends at its time.
    load_s = settings.config.intervals.load_s
    back = next(
        (end - load_s for end, n, *_ in run.timeline if end >= run.last_arrival_s and n <= settings.min_fleet), None
    )
    changes = [c for role in settings.roles for c in run.changes.get(role, [])]
    row: dict[str, Any] = {
        "config": run.config,
        "replicas": max(n for _, n, *_ in run.timeline) if run.timeline else 0,
        "requests": total,
        "good": good,
        "sla_attainment": good / total if total else 0.0,
        "gpu_hours": gpu_hours,
        "goodput_per_gpu": good / gpu_hours if gpu_hours else 0.0,
        "ttft_p90_ms": _quantile([x for x in run.ttft.values() if x is not None], targets.ttft.quantile),
        "itl_p90_ms": _quantile([x for x in run.itl.values() if x is not None], targets.itl.quantile),
        "scale_events": len(changes),
        "reversals": sum(count_reversals(run.changes.get(role, [])) for role in settings.roles),
        "failed_at_scale_down": run.failed_at_scale_down,
        "rejected": run.rejected,
        "recovery_s": _recovery_s(
            run, settings.config.intervals.throughput_s, settings.config.intervals.load_s, settings.config.targets
        ),
        "to_min_s": None if back is None else max(0.0, back - run.last_arrival_s),
        "excluded_warmup": run.excluded_warmup,
        "excluded_backlog": run.excluded_backlog,
        "wall_s": run.wall_s,
    }
    if settings.disagg:
        # Each pool's most replicas and GPU hours; the table's "prefill+decode" column.
        most = {role: max((p[role] for p in run.pools), default=0) for role in settings.roles}
        row["pools"] = "+".join(str(most[role]) for role in settings.roles)
        row["roles"] = {
            role: {
                "replicas": most[role],
                "gpu_hours": run.role_seconds.get(role, 0.0) * settings.config.roles[role].gpus_per_replica / 3600.0,
                "scale_events": len(run.changes.get(role, [])),
            }
            for role in settings.roles
        }
        row["prefills"] = dict(run.prefills)
    return row


def _meets(run: Run, settings: Settings) -> bool:
    t = settings.config.targets
    ttft = _quantile([x for x in run.ttft.values() if x is not None], t.ttft.quantile)
    itl = _quantile([x for x in run.itl.values() if x is not None], t.itl.quantile)
    failed = run.rejected + sum(1 for x in run.ttft.values() if x is None)
    return failed == 0 and ttft is not None and ttft <= t.ttft.ms and (itl is None or itl <= t.itl.ms)


def _smallest(fits: Callable[[int], bool], high: int) -> int:
    """The smallest ``n`` in 1..``high`` that ``fits`` (bisection: more replicas never
    hurt); ``high`` when none below it does."""
    low = 1
    while low < high:
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid + 1
    return low


class _FixedFleets:
    """Fixed fleets replayed once each (by replicas, or by a (prefill, decode) pair),
    and whether each meets the targets over the whole workload, logged as found."""

    def __init__(self, workload: Workload, settings: Settings, log: Callable[[str], None]) -> None:
        self.workload, self.settings, self.log = workload, settings, log
        self.runs: dict[int | tuple[int, int], Run] = {}

    def run(self, fleet: int | tuple[int, int]) -> Run:
        if fleet not in self.runs:
            if isinstance(fleet, int):
                replicas: Fleet = fleet
                name = f"{fleet} replica(s)"
            else:
                replicas = {"prefill": fleet[0], "decode": fleet[1]}
                name = f"{fleet[0]} prefill + {fleet[1]} decode replica(s)"
            run = _replay(self.workload, self.settings, replicas, None, "static-peak")
            self.runs[fleet] = run
            self.log(f"static-peak: {name} {'meet' if _meets(run, self.settings) else 'miss'} the targets")
        return self.runs[fleet]

    def meets(self, fleet: int | tuple[int, int]) -> bool:
        return _meets(self.run(fleet), self.settings)


def static_peak(workload: Workload, settings: Settings, log: Callable[[str], None]) -> Run:
    """The smallest fixed fleet meeting the targets over the whole workload (bisection;
    ``max_replicas`` when none does)."""
    fleets = _FixedFleets(workload, settings, log)
    return fleets.run(_smallest(fleets.meets, settings.max_replicas))


def static_peak_pair(workload: Workload, settings: Settings, log: Callable[[str], None]) -> Run:
    """Disaggregated: the fixed (prefill, decode) pair with the fewest GPUs that meets the
    targets over the whole workload, by a coordinate search whose bisections take more
    replicas of a role never to hurt: (1) the smallest prefill pool that meets them with
    the decode pool at its most; (2) the smallest decode pool that meets them with that
    prefill pool; (3) one prefill replica more and the smallest decode pool that meets
    them with it, kept when it holds fewer GPUs (a busy decode pool delays first tokens,
    so a larger prefill pool can let a smaller decode pool meet the TTFT target). Each
    pool at its most when nothing meets them. Not exhaustive: a pair two or more prefill
    replicas away from (1)'s is not tried."""
    roles = settings.config.roles
    most_prefill, most_decode = roles["prefill"].max_replicas, roles["decode"].max_replicas
    fleets = _FixedFleets(workload, settings, log)
    prefill = _smallest(lambda n: fleets.meets((n, most_decode)), most_prefill)
    decode = _smallest(lambda n: fleets.meets((prefill, n)), most_decode)
    best = (prefill, decode)
    if prefill < most_prefill and decode > 1:
        fewer = _smallest(lambda n: fleets.meets((prefill + 1, n)), decode)
        gpus = settings.gpus
        if fleets.meets((prefill + 1, fewer)) and gpus({"prefill": prefill + 1, "decode": fewer}) < gpus(
            {"prefill": prefill, "decode": decode}
        ):
            best = (prefill + 1, fewer)
    return fleets.run(best)


def static_mean_fleet(workload: Workload, settings: Settings, model: PerformanceModel) -> Fleet:
    """The fixed fleet the performance model sizes for the workload's mean rate: each
    role by the targets it answers for (prefill TTFT, decode ITL, aggregated both), as
    the planner's ``Decider`` asks the model."""
    duration, isl, _, isls = workload.shape()
    rate = len(isls) / duration if duration > 0 else 0.0
    limits = {"agg": (settings.ttft_ms, settings.itl_ms), "prefill": (settings.ttft_ms, None),
              "decode": (None, settings.itl_ms)}
    fleet = {}
    for role in settings.roles:
        capacity = model.capacity(isl, *limits[role])
        most = settings.config.roles[role].max_replicas
        fleet[role] = most if capacity <= 0 else min(most, max(1, math.ceil(rate / capacity)))
    return fleet["agg"] if not settings.disagg else fleet


def planning_state(settings: Settings, model: PerformanceModel | None) -> PlanningState:
    """The planner's state for one configuration (``model`` None: the load loop alone).
    The simulated connector's start-up is known, as the local connector's delay is: it is
    the planner's start-up estimate until it sees one, unless the configuration sets one."""
    config = settings.config
    if config.expected_startup_s is None:
        config = config.model_copy(update={"expected_startup_s": settings.startup_s})
    if "warmup_speed" not in config.model_fields_set:
        config = config.model_copy(update={"warmup_speed": 1.0 / settings.warmup_factor})
    return PlanningState(config, Decider(config, model))


def compare(
    workload: Workload, settings: Settings, configs: Sequence[str] = CONFIGS, log: Callable[[str], None] = print,
) -> tuple[list[dict[str, Any]], dict[str, Run]]:
    """Replay ``workload`` under each of ``configs``; the rows and the runs."""
    runs: dict[str, Run] = {}
    profiles = profiles_for(workload, settings) if {"static-mean", "planner"} & set(configs) else None
    first = {role: settings.initial_replicas or max(1, settings.config.roles[role].min_replicas)
             for role in settings.roles}
    minimum: Fleet = first if settings.disagg else first["agg"]
    for name in configs:
        if name == "static-peak":
            find = static_peak_pair if settings.disagg else static_peak
            runs[name] = find(workload, settings, log)
        elif name == "static-mean":
            assert profiles is not None
            fleet = static_mean_fleet(workload, settings, model_for(profiles))
            runs[name] = _replay(workload, settings, fleet, None, name)
        elif name == "load-only":
            runs[name] = _replay(workload, settings, minimum, planning_state(settings, None), name)
        elif name == "planner":
            assert profiles is not None
            model = model_for(profiles)
            model.correction.warmup_s = settings.config.warmup_s
            runs[name] = _replay(workload, settings, minimum, planning_state(settings, model), name)
            runs[name].excluded_warmup = model.correction.excluded_warmup
            runs[name].excluded_backlog = model.correction.excluded_backlog
        else:
            raise ValueError(f"unknown configuration '{name}' ({', '.join(CONFIGS)})")
        log(f"{name}: replayed in {runs[name].wall_s:.1f} s")
    rows = [_row(run, settings) for run in runs.values()]
    peak = next((r for r in rows if r["config"] == "static-peak"), None)
    best = None
    if profiles is not None and not settings.disagg:  # one capacity per replica: aggregated only
        _, isl, _, _ = workload.shape()
        capacity = model_for(profiles).capacity(isl, settings.ttft_ms, settings.itl_ms)
        x = workload.time_scale
        if workload.phases is not None:
            phases = [(sec / x, r0 * x, r1 * x) for sec, r0, r1 in workload.phases]
        else:  # a trace: its rate per minute
            phases = [(60.0, r, r) for r in workload.rates(60.0)]
        if capacity > 0 and phases:
            best = best_ratio(phases, capacity)
            log(f"best possible vs static-peak on {workload.name}: {best:.2f}x "
                f"(ceil(rate / {capacity:.2f} req/s) replicas at every instant, mean prompt {isl:.0f} tokens)")
    for r in rows:
        base = peak["goodput_per_gpu"] if peak else 0.0
        r["vs_static_peak"] = r["goodput_per_gpu"] / base if base else None
        if best is not None:
            r["best_vs_static_peak"] = best
    return rows, runs


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as an aligned text table (disaggregated rows: each pool's most replicas
    in a ``prefill+decode`` column)."""
    columns = list(COLUMNS)
    if any("pools" in r for r in rows):
        columns.insert(2, ("prefill+decode", "pools", "{}"))
    table = [[title for title, _, _ in columns]]
    table += [["-" if r.get(key) is None else fmt.format(r[key]) for _, key, fmt in columns] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        for row in table
    )


def plot(runs: dict[str, Run], settings: Settings, path: Path, title: str) -> bool:
    """Replicas, arrival rate and p90 latencies over time, per configuration, as a PNG;
    False (with a message) without matplotlib."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib)", file=sys.stderr)
        return False
    fig, axes = plt.subplots(3, 1, figsize=(9, 8), sharex=True)
    for name, run in runs.items():
        ts = [p[0] / 60 for p in run.timeline]
        axes[0].step(ts, [p[1] for p in run.timeline], where="pre", label=name)  # over the window to each t
        if run.pools and len(run.pools[0]) > 1:  # disaggregated: each pool too, dotted
            for role in run.pools[0]:
                axes[0].step(ts, [p[role] for p in run.pools], where="pre", ls=":", lw=0.8, label=f"{name} {role}")
        axes[1].plot(ts, [p[3] if p[3] is not None else float("nan") for p in run.timeline], label=name, lw=0.8)
        axes[2].plot(ts, [p[4] if p[4] is not None else float("nan") for p in run.timeline], label=name, lw=0.8)
    first = next(iter(runs.values()), None)
    if first is not None:
        rate = axes[0].twinx()
        rate.plot([p[0] / 60 for p in first.timeline], [p[2] for p in first.timeline], color="grey", lw=0.6, alpha=0.6)
        rate.set_ylabel("arrivals/s (grey)")
    axes[1].axhline(settings.ttft_ms, color="black", ls="--", lw=0.8)
    axes[2].axhline(settings.itl_ms, color="black", ls="--", lw=0.8)
    axes[0].set_ylabel("replicas")
    axes[1].set_ylabel("p90 TTFT ms")
    axes[1].set_yscale("log")
    axes[2].set_ylabel("p90 ITL ms")
    axes[2].set_xlabel("simulated minutes")
    axes[0].set_title(title)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.planner.lab``."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo.planner.lab",
        description="Replay a trace through a simulated fleet with the planner in the loop; compare fleets.",
    )
    parser.add_argument(
        "trace",
        help="a Mooncake-format JSON-lines trace, 'ramp' (2 req/s, linear rise to 20, linear fall to 2; "
        "32 min) or 'step' (2 -> 20 -> 2 req/s, 5 min each)",
    )
    parser.add_argument("--config", type=Path,
                        help="planner.yaml (targets, intervals, predictor, roles: agg, or prefill and decode)")
    parser.add_argument("--ttft-ms", type=float, help="p90 TTFT target (overrides the config)")
    parser.add_argument("--itl-ms", type=float, help="p90 ITL target (overrides the config)")
    parser.add_argument("--max-replicas", type=int,
                        help="most replicas of each role (overrides roles.<role>.max_replicas)")
    parser.add_argument("--startup-seconds", type=float, default=30.0, help="replica start-up delay (default 30)")
    parser.add_argument("--warmup-seconds", type=float, default=10.0,
                        help="a new replica's slow first seconds (default 10)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="arrival-rate multiplier (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the ramp and the engines (default 0)")
    parser.add_argument("--limit", type=int, help="replay only the first N requests of the trace")
    parser.add_argument("--shape", choices=sorted(SYNTHETIC),
                        help="re-time the trace's requests so their rate follows this synthetic workload's shape "
                        "(scaled to hold them all; lengths, blocks and order kept)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated rows (default: all)")
    parser.add_argument("--busy-threshold", type=float,
                        help="the router's busy threshold (0-1]: arrivals wait at the frontend while every ready "
                        "replica's KV demand is at or over it (default: none, they queue on a replica)")
    parser.add_argument("--max-local-prefill-length", type=int,
                        help="disaggregated roles: a decode replica prefills remotely only a prompt whose uncached "
                        "part is longer than this (tokens; default: the decode worker's, 1000)")
    parser.add_argument("--engine-args", type=Path, help="JSON file of mocker settings (see docs/mocker.md)")
    parser.add_argument("--write-trace", type=Path, metavar="FILE",
                        help="write the workload as replayed (seed, shape, limit and time scale applied) as a "
                        "Mooncake-format trace to FILE and exit: e.g. a previous period's arrivals for "
                        "predictor.warm_start_trace")
    parser.add_argument("--json", type=Path, help="write the rows as JSON here")
    parser.add_argument("--plot", type=Path, help="write a PNG of replicas and latency over time here")
    args = parser.parse_args(argv)
    args.configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    if not args.configs or any(c not in CONFIGS for c in args.configs):
        parser.error(f"--configs: choose from {', '.join(CONFIGS)}")
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0")
    if args.busy_threshold is not None and not 0 < args.busy_threshold <= 1:
        parser.error("--busy-threshold must be in (0, 1]")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.max_local_prefill_length is not None and args.max_local_prefill_length < 0:
        parser.error("--max-local-prefill-length must be >= 0")
    return args


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dynamo" / "planner-lab"


def settings_from(args: argparse.Namespace) -> Settings:
    """The lab's settings from its command line.

    Raises:
        PlannerConfigError: the configuration or an override is invalid.
    """
    overrides: dict[str, Any] = {}
    if args.ttft_ms is not None:
        overrides["targets.ttft.ms"] = args.ttft_ms
    if args.itl_ms is not None:
        overrides["targets.itl.ms"] = args.itl_ms
    if args.config is None:
        overrides.setdefault("model", "planner-lab")
    config = load_config(args.config, overrides)
    if args.max_replicas is not None:
        roles = ROLES_AGG if "agg" in config.roles else ROLES_DISAGG
        most = {f"roles.{r}.max_replicas": args.max_replicas for r in roles}
        config = load_config(args.config, {**overrides, **most})
    if args.max_local_prefill_length is not None and "agg" in config.roles:
        raise PlannerConfigError("--max-local-prefill-length needs disaggregated roles (prefill and decode)")
    return Settings(
        config=config, startup_s=args.startup_seconds, warmup_s=args.warmup_seconds, seed=args.seed,
        engine_args=args.engine_args.read_text() if args.engine_args else None, cache_dir=_cache_dir(),
        busy_threshold=args.busy_threshold, max_local_prefill_length=args.max_local_prefill_length,
    )


def _segment_time(c: float, seconds: float, r0: float, r1: float) -> float:
    """The time into a segment (rate linear from ``r0`` to ``r1`` over ``seconds``) by which
    ``c`` requests have arrived: the root of ``r0 t + (r1 - r0) t^2 / (2 seconds) = c``."""
    a, b = (r1 - r0) / (2.0 * seconds), r0
    if abs(a) < 1e-12:
        return c / b if b > 0 else seconds
    root = b * b + 4.0 * a * c
    return min(seconds, max(0.0, (-b + math.sqrt(max(0.0, root))) / (2.0 * a)))


Phases = Sequence[tuple[float, float, float]]


def warp(stamps_ms: Sequence[float], phases: Phases) -> tuple[list[float], list[tuple[float, float, float]]]:
    """Re-time arrivals so that their rate follows the shape of ``phases``, keeping their
    order and their local bursts: ``phases``' rates are scaled so that the shape holds
    exactly ``len(stamps_ms)`` requests, and the arrival at fraction ``u`` of the
    original span moves to where the scaled shape has seen ``u`` of its requests (a flat
    trace comes out following the shape; a burst in it stays a burst). Returns the new
    times (ms) and the scaled phases."""
    if not stamps_ms:
        return [], list(phases)
    counts = [seconds * (r0 + r1) / 2.0 for seconds, r0, r1 in phases]
    total = sum(counts)
    if total <= 0 or any(r0 < 0 or r1 < 0 or seconds <= 0 for seconds, r0, r1 in phases):
        raise ValueError("a shape needs positive durations, rates >= 0 and some arrivals")
    k = len(stamps_ms) / total
    scaled = [(seconds, r0 * k, r1 * k) for seconds, r0, r1 in phases]
    first, last = min(stamps_ms), max(stamps_ms)
    span = last - first
    out = []
    for t in stamps_ms:
        target = len(stamps_ms) * ((t - first) / span if span > 0 else 0.5)
        start = 0.0
        for i, ((seconds, r0, r1), n) in enumerate(zip(scaled, (c * k for c in counts), strict=True)):
            if target <= n or i == len(scaled) - 1:
                out.append((start + _segment_time(min(target, n), seconds, r0, r1)) * 1000.0)
                break
            target -= n
            start += seconds
    return out, scaled


def workload_from(trace: str, time_scale: float, seed: int, limit: int | None, shape: str | None = None) -> Workload:
    """``ramp``, ``step`` or a trace file. Its first ``limit`` requests, and with ``shape``
    those re-timed onto that synthetic workload's shape by ``warp``, are written under the
    lab's cache as a trace of their own, prefix blocks and lengths kept."""
    if trace in SYNTHETIC:
        if shape is not None:
            raise ValueError("--shape re-times a trace file; 'ramp' and 'step' have their own shape")
        return Workload(trace, requests=ramp(seed, SYNTHETIC[trace]), time_scale=time_scale, phases=SYNTHETIC[trace])
    path = Path(trace)
    if shape is None and limit is None:
        return Workload(path.name, trace=path, time_scale=time_scale)
    if shape is not None and shape not in SYNTHETIC:
        raise ValueError(f"unknown shape '{shape}' ({', '.join(SYNTHETIC)})")
    with path.open() as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    rows = rows[:limit] if limit is not None else rows
    name = f"{path.name}[:{limit}]" if limit is not None else path.name
    if shape is not None:
        stamps, _ = warp([float(r["timestamp"]) for r in rows], SYNTHETIC[shape])
        rows = [{**r, "timestamp": round(t, 3)} for r, t in zip(rows, stamps, strict=True)]
        name = f"{name} on {shape}"
    text = "".join(json.dumps(r) + "\n" for r in rows)
    out = _cache_dir() / f"trace-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return Workload(name, trace=out, time_scale=time_scale)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = settings_from(args)
        workload = workload_from(args.trace, args.time_scale, args.seed, args.limit, args.shape)
    except (PlannerConfigError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.write_trace:
        try:
            n = workload.write_trace(args.write_trace)
        except OSError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {n} requests of {workload.name} to {args.write_trace}", file=sys.stderr)
        return 0
    started = time.perf_counter()
    rows, runs = compare(workload, settings, args.configs, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(format_table(rows))
    print(f"({workload.name}, time scale {args.time_scale:g}: {time.perf_counter() - started:.1f} s)", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.plot:
        t = settings.config.targets
        title = f"{workload.name} x{args.time_scale:g}: p90 TTFT <= {t.ttft.ms:g} ms, p90 ITL <= {t.itl.ms:g} ms"
        if plot(runs, settings, args.plot, title):
            print(f"wrote {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

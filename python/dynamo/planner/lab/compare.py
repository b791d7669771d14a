"""The four configurations of the lab, each replayed and scored: the fixed fleets
(static-peak found by bisection, static-mean sized by the model) and the planner with
and without a profile (``compare``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from dynamo.planner.decide import Decider
from dynamo.planner.lab.engine import Fleet, profiles_for
from dynamo.planner.lab.replay import Run, replay
from dynamo.planner.lab.score import meets, row
from dynamo.planner.lab.settings import Settings
from dynamo.planner.lab.workload import Workload, best_ratio
from dynamo.planner.profile import PerformanceModel, model_for
from dynamo.planner.step import PlanningState

CONFIGS = ("static-peak", "static-mean", "load-only", "planner")


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
            run = replay(self.workload, self.settings, replicas, None, "static-peak")
            self.runs[fleet] = run
            self.log(f"static-peak: {name} {'meet' if meets(run, self.settings) else 'miss'} the targets")
        return self.runs[fleet]

    def meets(self, fleet: int | tuple[int, int]) -> bool:
        return meets(self.run(fleet), self.settings)


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
            runs[name] = replay(workload, settings, fleet, None, name)
        elif name == "load-only":
            runs[name] = replay(workload, settings, minimum, planning_state(settings, None), name)
        elif name == "planner":
            assert profiles is not None
            model = model_for(profiles)
            model.correction.warmup_s = settings.config.warmup_s
            runs[name] = replay(workload, settings, minimum, planning_state(settings, model), name)
            runs[name].excluded_warmup = model.correction.excluded_warmup
            runs[name].excluded_backlog = model.correction.excluded_backlog
        else:
            raise ValueError(f"unknown configuration '{name}' ({', '.join(CONFIGS)})")
        log(f"{name}: replayed in {runs[name].wall_s:.1f} s")
    rows = [row(run, settings) for run in runs.values()]
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

"""A run's figures: its row (attainment, GPU hours, goodput per GPU, scale events,
reversals, ``recovery_s``, ``to_min_s``), and whether it meets the targets over the
whole workload (``meets``, static-peak's test)."""

from __future__ import annotations

import math
from typing import Any

from dynamo.planner.config import Targets
from dynamo.planner.decide import count_reversals
from dynamo.planner.lab.replay import Run, quantile
from dynamo.planner.lab.settings import Settings

#: A rise of the arrival rate by this factor from one throughput interval to the next
#: is a load step (for ``recovery_s``).
STEP_FACTOR = 1.5


def _breaks(run: Run, indices: list[int], targets: Targets) -> bool:
    """Whether the requests ``indices`` break a target at its quantile (one that never
    got a first token counts as late)."""
    ttfts = [math.inf if run.ttft.get(i) is None else run.ttft[i] for i in indices]
    itls = [run.itl[i] for i in indices if run.itl.get(i) is not None]
    ttft_q, itl_q = quantile(ttfts, targets.ttft.quantile), quantile(itls, targets.itl.quantile)
    return (ttft_q is not None and ttft_q > targets.ttft.ms) or (itl_q is not None and itl_q > targets.itl.ms)


def broken_after_s(run: Run, since: float, bin_s: float, targets: Targets) -> float:
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


def recovery_s(run: Run, throughput_s: float, load_s: float, targets: Targets) -> float:
    """The longest time from a load step (the arrival rate over a throughput interval
    rising by ``STEP_FACTOR`` or more) until the requests sent after it meet the targets
    again (``broken_after_s``, in load-interval bins)."""
    per = max(1, round(throughput_s / load_s))
    rates = [sum(r for _, _, r, _, _ in run.timeline[i:i + per]) / per for i in range(0, len(run.timeline), per)]
    worst = 0.0
    for k in range(1, len(rates)):
        if (rates[k - 1] > 0 and rates[k] >= STEP_FACTOR * rates[k - 1]) or rates[k - 1] == 0 < rates[k]:
            step_at = k * per * load_s
            worst = max(worst, broken_after_s(run, step_at, load_s, targets))
    return worst


def row(run: Run, settings: Settings) -> dict[str, Any]:
    """The run's figures, keyed as the lab's JSON rows (docs/planner.md, "The lab")."""
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
    out: dict[str, Any] = {
        "config": run.config,
        "replicas": max(n for _, n, *_ in run.timeline) if run.timeline else 0,
        "requests": total,
        "good": good,
        "sla_attainment": good / total if total else 0.0,
        "gpu_hours": gpu_hours,
        "goodput_per_gpu": good / gpu_hours if gpu_hours else 0.0,
        "ttft_p90_ms": quantile([x for x in run.ttft.values() if x is not None], targets.ttft.quantile),
        "itl_p90_ms": quantile([x for x in run.itl.values() if x is not None], targets.itl.quantile),
        "scale_events": len(changes),
        "reversals": sum(count_reversals(run.changes.get(role, [])) for role in settings.roles),
        "failed_at_scale_down": run.failed_at_scale_down,
        "rejected": run.rejected,
        "recovery_s": recovery_s(
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
        out["pools"] = "+".join(str(most[role]) for role in settings.roles)
        out["roles"] = {
            role: {
                "replicas": most[role],
                "gpu_hours": run.role_seconds.get(role, 0.0) * settings.config.roles[role].gpus_per_replica / 3600.0,
                "scale_events": len(run.changes.get(role, [])),
            }
            for role in settings.roles
        }
        out["prefills"] = dict(run.prefills)
    return out


def meets(run: Run, settings: Settings) -> bool:
    """Whether every request was served and the whole run's quantiles meet the targets
    (static-peak's test of a fixed fleet)."""
    t = settings.config.targets
    ttft = quantile([x for x in run.ttft.values() if x is not None], t.ttft.quantile)
    itl = quantile([x for x in run.itl.values() if x is not None], t.itl.quantile)
    failed = run.rejected + sum(1 for x in run.ttft.values() if x is None)
    return failed == 0 and ttft is not None and ttft <= t.ttft.ms and (itl is None or itl <= t.itl.ms)

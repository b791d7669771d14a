"""What a planner with perfect foresight reaches in the planner lab: the bound the
planner row is measured against (docs/performance.md, "An oracle on the ramp").

The oracle knows the synthetic shape's rate at every instant (the rate the arrivals
are drawn from, not the arrivals). At each load pass, at ``t``, it sets the fleet to
``ceil(rate / per_replica)`` for the highest rate from ``t`` until a replica asked for at
``t`` would be ready and the next pass could act (``t + startup + load interval``), so
every replica it adds is ready before the rate needs it and every one it removes is no
longer needed. It pays the start-up and the warm-up as the planner does, on the same
simulated fleet. ``per_replica`` (req/s a replica is given) is swept: the highest is the
sizing the lab's ``best possible`` assumes (the profile's capacity at the targets);
lower ones buy headroom for attainment. ``--floor N`` keeps at least N replicas (on a
trace, the low phases' long prompts want more replicas than their rate says). For each
value it prints goodput per GPU-hour
against static-peak's, the fraction within both targets and the GPU hours, over the
seeds asked:

    python benches/planner_lab_oracle.py ramp --config lab.yaml --ttft-ms 1000 --itl-ms 60 \\
        --max-replicas 16 --per-replica 2.6,2.8,3.0,3.2,3.4 --seeds 0-9

Takes the lab's own arguments (``python -m dynamo.planner.lab --help``; a synthetic
workload, ``ramp`` or ``step``, or a trace with ``--shape``) and these three.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from dynamo.planner import lab
from dynamo.planner.decide import Decision, RoleState

#: Steps (s) at which the oracle looks for the highest rate over its horizon.
LOOK_STEP_S = 1.0


class Oracle:
    """The planning state ``lab.replay`` drives, sizing the fleet from the known rate."""

    def __init__(self, phases: Sequence[tuple[float, float, float]], per_replica: float, horizon_s: float,
                 most: int, least: int = 1) -> None:
        self.phases, self.per_replica, self.horizon_s = phases, per_replica, horizon_s
        self.most, self.least = most, least
        self.fleet: dict[str, RoleState] = {}

    def note_fleet(self, fleet: Mapping[str, RoleState], now: float) -> None:
        self.fleet = dict(fleet)

    def size(self, now: float) -> int:
        """Replicas for the highest rate from ``now`` to ``now + horizon_s``."""
        steps = int(self.horizon_s / LOOK_STEP_S) + 1
        top = max(lab.rate_at(self.phases, now + k * LOOK_STEP_S) for k in range(steps))
        return min(self.most, max(self.least, math.ceil(top / self.per_replica - 1e-9)))

    def load_step(self, window: Any, fleet: Mapping[str, RoleState], waiting: Any, missing: Any,
                  now: float, throughput: bool = False) -> list[Decision]:
        current = fleet["agg"].total
        return [Decision("agg", "load", current, self.size(now), "oracle")]

    def throughput_step(self, fleet: Mapping[str, RoleState]) -> list[Decision]:
        return []

    def urgent_step(self, fleet: Mapping[str, RoleState], waiting: Any, now: float) -> list[Decision]:
        return []

    def backlog(self, waiting: Any) -> bool:
        return False


def one(argv: list[str], seed: int, per_replica: list[float], floor: int) -> list[dict[str, Any]]:
    """Static-peak and the oracle at each ``per_replica`` for one seed."""
    args = lab.parse_args([*argv, "--seed", str(seed)])
    settings = lab.settings_from(args)
    workload = lab.workload_from(args.trace, args.time_scale, args.seed, args.limit, args.shape)
    if settings.disagg:
        raise SystemExit("the oracle sizes an aggregated fleet")
    phases = lab.SYNTHETIC.get(args.shape or args.trace)
    if phases is None:
        raise SystemExit("the oracle needs a synthetic shape: 'ramp', 'step', or a trace with --shape")
    if workload.phases is None:  # a trace on a shape: the shape's rates scaled to hold it
        requests = len(workload.shape()[3])
        k = requests / sum(seconds * (r0 + r1) / 2.0 for seconds, r0, r1 in phases)
        phases = [(seconds, r0 * k, r1 * k) for seconds, r0, r1 in phases]
    x = workload.time_scale
    phases = [(sec / x, r0 * x, r1 * x) for sec, r0, r1 in phases]
    peak = lab.row(lab.static_peak(workload, settings, log=lambda m: None), settings)
    config = settings.config
    horizon = settings.startup_s + config.intervals.load_s
    # No urgent checks: the oracle has nothing to catch up with.
    oracle_settings = dataclasses.replace(
        settings, config=config.model_copy(update={"intervals": config.intervals.model_copy(update={"urgent_s": None})})
    )
    rows = [dict(peak, seed=seed, per_replica=None)]
    for c in per_replica:
        oracle = Oracle(phases, c, horizon, settings.max_replicas, floor)
        first = oracle.size(0.0)
        run = lab.replay(workload, oracle_settings, first, oracle, f"oracle {c:g}")  # type: ignore[arg-type]
        rows.append(dict(lab.row(run, settings), seed=seed, per_replica=c))
    return rows


def seeds_of(text: str) -> list[int]:
    """``0-9`` or ``0,3,5``."""
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--per-replica", default="2.6,2.8,3.0,3.2,3.4", help="req/s a replica is given (comma-separated)")
    own.add_argument("--seeds", default="0", help="seeds, '0-9' or '0,3,5' (default 0)")
    own.add_argument("--floor", type=int, default=1, help="replicas the oracle always keeps (default 1)")
    mine, rest = own.parse_known_args()
    per_replica = [float(c) for c in mine.per_replica.split(",")]
    seeds = seeds_of(mine.seeds)
    with ProcessPoolExecutor(2) as pool:
        n = len(seeds)
        results = list(pool.map(one, [rest] * n, seeds, [per_replica] * n, [mine.floor] * n))
    print("per_replica  seed  within targets  GPU h  goodput/GPU h  vs static-peak  most replicas")
    summary: dict[float, list[tuple[float, float]]] = {c: [] for c in per_replica}
    for rows in results:
        peak = rows[0]
        for r in rows[1:]:
            ratio = r["goodput_per_gpu"] / peak["goodput_per_gpu"]
            summary[r["per_replica"]].append((ratio, r["sla_attainment"]))
            print(f"{r['per_replica']:11g}  {r['seed']:4d}  {r['sla_attainment']:14.3f}  {r['gpu_hours']:5.3f}  "
                  f"{r['goodput_per_gpu']:13.0f}  {ratio:13.2f}x  {r['replicas']:13d}")
        print(f"{'static-peak':>11}  {peak['seed']:4d}  {peak['sla_attainment']:14.3f}  {peak['gpu_hours']:5.3f}  "
              f"{peak['goodput_per_gpu']:13.0f}  {1:13.2f}x  {peak['replicas']:13d}")
    print("\nper_replica  mean ratio  lowest ratio  lowest within targets  mean within targets")
    for c, pairs in summary.items():
        ratios, slas = [p[0] for p in pairs], [p[1] for p in pairs]
        print(f"{c:11g}  {statistics.mean(ratios):9.2f}x  {min(ratios):11.2f}x  {min(slas):21.3f}  "
              f"{statistics.mean(slas):19.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The planner climbing from one replica into a constant Poisson load on an engine that
saturates (the lab's mocker with ``max_num_seqs``), against the smallest fixed fleet
that meets the targets (docs/performance.md, "The wait for a slot" and "The demand's
level, and a backlog that just emptied"):

    python benches/planner_lab_climb.py --rate 6 --seconds 900 --seeds 0-2

The lab set-up of ``tests/test_planner_lab.py``: p90 TTFT 1000 ms and ITL 60 ms, 1 to 16
replicas, load passes every 10 s and throughput passes every 20 s, 10 s start-up, 5 s
warm-up, 3,072 + 256 tokens. Per seed: the planner's most replicas, the fleet it
settles at (at the last arrival), reversals, requests within both targets, GPU hours and
goodput per GPU-hour, with static-peak's beside it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dynamo.planner.config import build_config
from dynamo.planner.lab import Settings, Workload, compare, ramp
from planner_lab_oracle import seeds_of


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=6.0, help="requests per second (default 6)")
    parser.add_argument("--seconds", type=float, default=900.0, help="length of the load (default 900)")
    parser.add_argument("--initial-replicas", type=int, default=1, help="the planner's fleet at the start")
    parser.add_argument("--max-num-seqs", type=int, default=4, help="the engine's slots (default 4)")
    parser.add_argument("--seeds", default="0-2", help="0-9 or 0,3,5 (default 0-2)")
    args = parser.parse_args()
    data = {
        "model": "lab",
        "targets": {"ttft": {"ms": 1000}, "itl": {"ms": 60}},
        "roles": {"agg": {"min_replicas": 1, "max_replicas": 16}},
        "intervals": {"load_s": 10, "throughput_s": 20},
    }
    print("seed  static-peak (SLA, goodput/GPU h)  most  settles  reversals  within targets  GPU h  goodput/GPU h")
    with tempfile.TemporaryDirectory() as cache:
        settings = Settings(config=build_config(data), startup_s=10.0, warmup_s=5.0, cache_dir=Path(cache),
                            engine_args=json.dumps({"max_num_seqs": args.max_num_seqs}))
        for seed in seeds_of(args.seeds):
            workload = Workload("constant", requests=ramp(seed, [(args.seconds, args.rate, args.rate)]))
            settings.initial_replicas = None
            [peak], _ = compare(workload, settings, ("static-peak",), log=lambda _: None)
            settings.initial_replicas = args.initial_replicas
            [row], runs = compare(workload, settings, ("planner",), log=lambda _: None)
            run = runs["planner"]
            counts = [n for end, n, *_ in run.timeline if end <= run.last_arrival_s]
            print(f"{seed:>4}  {peak['replicas']:>4} ({peak['sla_attainment']:.3f}, {peak['goodput_per_gpu']:,.0f})"
                  f"{'':>13}{max(counts):>4}  {counts[-1]:>7}  {row['reversals']:>9}  {row['sla_attainment']:>14.3f}"
                  f"  {row['gpu_hours']:>5.2f}  {row['goodput_per_gpu']:>13,.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

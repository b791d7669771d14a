"""The planner lab over several seeds: static-peak and the planner for each, and the
spread of the planner's ratio and attainment (docs/performance.md, "Start-up from the
ask" and "A season of history"). One seed's row moves by one decision; the ten-seed
mean and the lowest attainment are what a change is judged by. Each row also counts the
requests the planner's run refused (behind a bounded busy wait, ``--busy-threshold F
--busy-wait-s S``: docs/planner.md, "Behind a frontend that refuses past a bound").

    python benches/planner_lab_seeds.py ramp --config lab.yaml --ttft-ms 1000 --itl-ms 60 \\
        --max-replicas 16 --seeds 0-9 [--history]

With ``--history`` each seed's planner is warm-started from the previous period: the same
synthetic workload drawn with seed + 1000, written as a trace (the lab's
``--write-trace``) and set as ``predictor.warm_start_trace``; the configuration chooses
the predictor (``holt_winters`` with a ``season`` of the workload's length in throughput
intervals: 96 for the ramp at 20 s, 45 for the step). ``--rows FILE`` writes the per-seed
rows as JSON; ``--against FILE`` (an earlier run's rows) then prints the planner's own
goodput per GPU-hour against that run's, seed by seed (mean ± standard error), and its
goodput over that run's static-peak: how a change is judged when it moves static-peak
too, as a frontend setting does (docs/performance.md, "The busy threshold with a wait
at the frontend"). Takes the lab's own arguments (``python -m dynamo.planner.lab
--help``) and these four.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from dynamo.planner import lab
from planner_lab_oracle import seeds_of

#: The previous period of seed N is drawn with seed N + this.
PREVIOUS = 1000


def one(argv: list[str], seed: int, history: str | None) -> dict[str, Any]:
    """Static-peak and the planner for one seed (``history``: a folder for the previous
    period's trace)."""
    args = lab.parse_args([*argv, "--seed", str(seed)])
    settings = lab.settings_from(args)
    workload = lab.workload_from(args.trace, args.time_scale, args.seed, args.limit, args.shape)
    if history is not None:
        if args.trace not in lab.SYNTHETIC:
            raise SystemExit("--history draws the previous period of a synthetic workload: 'ramp' or 'step'")
        previous = lab.workload_from(args.trace, args.time_scale, seed + PREVIOUS, None)
        path = Path(history) / f"previous-{seed}.jsonl"
        previous.write_trace(path)
        config = settings.config
        predictor = config.predictor.model_copy(update={"warm_start_trace": path})
        settings = dataclasses.replace(settings, config=config.model_copy(update={"predictor": predictor}))
    rows, _ = lab.compare(workload, settings, ("static-peak", "planner"), log=lambda m: None)
    peak, planner = rows
    return dict(planner, seed=seed, peak_replicas=peak["replicas"], peak_sla=peak["sla_attainment"],
                peak_goodput=peak["goodput_per_gpu"])


def against(rows: list[dict[str, Any]], before: list[dict[str, Any]]) -> str:
    """How ``rows`` compare with ``before`` (an earlier run's ``--rows``) seed by seed: the
    change of the planner's own goodput per GPU-hour (mean ± its standard error), and the
    planner's goodput over the earlier run's static-peak (so a static fleet that needs a
    replica more this time does not lift the ratio)."""
    earlier = {r["seed"]: r for r in before}
    pairs = [(r, earlier[r["seed"]]) for r in rows if r["seed"] in earlier]
    if not pairs:
        return "no seed in common with --against"
    change = [r["goodput_per_gpu"] / b["goodput_per_gpu"] - 1 for r, b in pairs if b["goodput_per_gpu"]]
    ratio = [r["goodput_per_gpu"] / b["peak_goodput"] for r, b in pairs if b["peak_goodput"]]
    error = statistics.stdev(change) / len(change) ** 0.5 if len(change) > 1 else 0.0
    return (f"against {len(pairs)} seed(s) of the earlier run: the planner's own goodput/GPU h "
            f"{statistics.mean(change):+.1%} ± {error:.1%} ({min(change):+.1%} to {max(change):+.1%}); "
            f"{statistics.mean(ratio):.3f}x that run's static-peak ({min(ratio):.2f}-{max(ratio):.2f}x)")


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--seeds", default="0-9", help="seeds, '0-9' or '0,3,5' (default 0-9)")
    own.add_argument("--history", action="store_true",
                     help="warm the predictor with the previous period (the workload at seed + 1000)")
    own.add_argument("--rows", type=Path, help="write the per-seed rows here (JSON), for a later --against")
    own.add_argument("--against", type=Path,
                     help="an earlier run's --rows: the planner's own goodput per seed against it, and its "
                     "goodput over that run's static-peak")
    mine, rest = own.parse_known_args()
    seeds = seeds_of(mine.seeds)
    with tempfile.TemporaryDirectory() as folder, ProcessPoolExecutor(2) as pool:
        history = folder if mine.history else None
        rows = list(pool.map(one, [rest] * len(seeds), seeds, [history] * len(seeds)))
    print("seed  static-peak (SLA)  planner vs peak  within targets  GPU h  most replicas  reversals  recovery s  "
          "refused")
    for r in rows:
        print(f"{r['seed']:4d}  {r['peak_replicas']:5d} ({r['peak_sla']:.3f})  {r['vs_static_peak']:14.2f}x  "
              f"{r['sla_attainment']:14.3f}  {r['gpu_hours']:5.3f}  {r['replicas']:13d}  {r['reversals']:9d}  "
              f"{'-' if r['recovery_s'] is None else format(r['recovery_s'], '.0f'):>10}  {r['rejected']:7d}")
    ratios = [r["vs_static_peak"] for r in rows]
    slas = [r["sla_attainment"] for r in rows]
    reversals = [r["reversals"] for r in rows]
    refused = [r["rejected"] / r["requests"] for r in rows]
    print(f"\nmean {statistics.mean(ratios):.3f}x ({min(ratios):.2f}-{max(ratios):.2f}x), within targets lowest "
          f"{min(slas):.3f} mean {statistics.mean(slas):.3f}, reversals {min(reversals)}-{max(reversals)}, "
          f"refused at most {max(refused):.2%} of the requests")
    if mine.rows:
        mine.rows.write_text(json.dumps(rows, indent=1) + "\n")
    if mine.against:
        print(against(rows, json.loads(mine.against.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())

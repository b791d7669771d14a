"""Where the planner lab's misses are: each request outside the targets by cause (a TTFT
over its target first, else an ITL over its target; "long" is a prompt over
``--long-tokens``) and by the phase of the shape it was sent in, for the planner row and
for fixed fleets of any size (docs/performance.md, "The shared trace on the ramp's
shape", "Where the misses are"):

    python benches/planner_lab_misses.py ../shared/traces/mooncake_conversation_trace.jsonl \\
        --shape ramp --ttft-ms 30000 --itl-ms 100 --max-replicas 64 --config lab.yaml \\
        --fleets 46,64,96 [--initial-replicas 6]

Takes the lab's own arguments (``python -m dynamo.planner.lab --help``) and these three.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections import Counter

from dynamo.planner import lab


def phase_ends(shape: str | None, trace: str) -> list[float]:
    """The end (s) of each phase of the workload's shape (one phase without a shape)."""
    phases = lab.SYNTHETIC.get(shape or trace)
    if phases is None:
        return [float("inf")]
    ends, t = [], 0.0
    for seconds, _, _ in phases:
        t += seconds
        ends.append(t)
    ends[-1] = float("inf")
    return ends


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--fleets", default="", help="fixed fleet sizes to replay too (comma-separated)")
    own.add_argument("--initial-replicas", type=int, help="replicas the planner starts with (default: its minimum)")
    own.add_argument("--long-tokens", type=int, default=30000, help="a prompt longer than this is 'long'")
    mine, rest = own.parse_known_args()
    args = lab.parse_args(rest)
    settings = dataclasses.replace(lab.settings_from(args), initial_replicas=mine.initial_replicas)
    workload = lab.workload_from(args.trace, args.time_scale, args.seed, args.limit, args.shape)
    _, runs = lab.compare(workload, settings, ["planner"], log=lambda m: print(m, file=sys.stderr))
    for n in (int(x) for x in mine.fleets.split(",") if x.strip()):
        runs[f"{n} fixed"] = lab.replay(workload, settings, n, None, f"{n} fixed")
    lengths = {}
    if workload.trace is not None:
        with open(workload.trace) as lines:
            rows = (json.loads(line) for line in lines if line.strip())
            lengths = {i: r["input_length"] for i, r in enumerate(rows)}
    else:
        lengths = {i: isl for i, (_, isl, _) in enumerate(workload.requests or [])}
    ends = phase_ends(args.shape, args.trace)
    targets = settings.config.targets
    print(f"phases end at {ends} s; misses as TTFT long / short, ITL long / short")
    for name, run in runs.items():
        row = lab.row(run, settings)
        misses: Counter[tuple[int, str]] = Counter()
        for i, sent in run.sent.items():
            phase = next(k for k, end in enumerate(ends) if sent < end)
            ttft, itl = run.ttft.get(i), run.itl.get(i)
            size = "long" if lengths.get(i, 0) > mine.long_tokens else "short"
            if ttft is None or ttft > targets.ttft.ms:
                misses[phase, f"ttft {size}"] += 1
            elif itl is not None and itl > targets.itl.ms:
                misses[phase, f"itl {size}"] += 1
        cells = [
            f"{misses[k, 'ttft long']} / {misses[k, 'ttft short']}, {misses[k, 'itl long']} / {misses[k, 'itl short']}"
            for k in range(len(ends))
        ]
        print(f"{name}: within targets {row['sla_attainment']:.3f}, {row['gpu_hours']:.2f} GPU h, "
              f"{row['goodput_per_gpu']:.0f} goodput/GPU h | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

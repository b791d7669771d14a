"""The command line of ``python -m dynamo.planner.lab``."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo.planner.config import ROLES_AGG, ROLES_DISAGG, PlannerConfigError, load_config
from dynamo.planner.lab.compare import CONFIGS, compare
from dynamo.planner.lab.report import format_table, plot
from dynamo.planner.lab.settings import Settings, cache_dir
from dynamo.planner.lab.workload import SYNTHETIC, workload_from


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
                        help="the router's busy threshold (0-1], with the frontend's busy wait: arrivals wait at "
                        "the frontend while every ready replica's KV demand is at or over it (default: none, they "
                        "queue on a replica)")
    parser.add_argument("--busy-wait-s", type=float,
                        help="with --busy-threshold, the frontend's --busy-wait-s: an arrival held this many seconds "
                        "is refused (default: held without a bound)")
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
    if args.busy_wait_s is not None and (args.busy_threshold is None or not args.busy_wait_s > 0):
        parser.error("--busy-wait-s needs --busy-threshold and must be > 0")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.max_local_prefill_length is not None and args.max_local_prefill_length < 0:
        parser.error("--max-local-prefill-length must be >= 0")
    return args


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
        engine_args=args.engine_args.read_text() if args.engine_args else None, cache_dir=cache_dir(),
        busy_threshold=args.busy_threshold, busy_wait_s=args.busy_wait_s,
        max_local_prefill_length=args.max_local_prefill_length,
    )


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

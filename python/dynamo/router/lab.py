"""``python -m dynamo.router.lab TRACE.jsonl``: the routing lab. Replays a Mooncake-format
trace through N simulated mocker engines on a virtual clock (no sleeping), once per routing
policy, and prints per policy the prefix-cache hit rate, TTFT p50/p99, ITL p50, throughput
and load imbalance; with matplotlib installed it also writes a PNG of the TTFT CDFs. With
the frontend's admission limits (``--max-inflight-requests``, ``--max-queued-tokens``,
``--admission-ttft-ms``) each arrival passes them first: the table counts the requests
admitted and refused, and its TTFT columns are the admitted requests'.

An operator uses it to choose a policy and its weights before a deployment (see
docs/kv-routing.md, "Routing lab").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from dynamo._core import run_routing_lab

POLICIES = ("kv", "approx", "round-robin", "random")
COLUMNS = (
    ("policy", "policy", "{}"),
    ("hit rate", "hit_rate", "{:.3f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.1f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.1f}"),
    ("ITL p50 ms", "itl_p50_ms", "{:.2f}"),
    ("tok/s", "throughput_tok_s", "{:.0f}"),
    ("imbalance", "load_imbalance", "{:.2f}"),
    ("admitted", "admitted", "{}"),
    ("refused", "refused", "{}"),
    ("rejected", "rejected", "{}"),
    ("wall s", "wall_s", "{:.1f}"),
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.router.lab``."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo.router.lab",
        description="Replay a Mooncake-format trace through simulated workers, once per routing policy.",
    )
    parser.add_argument("trace", type=Path, help="JSON lines: timestamp (ms), input_length, output_length, hash_ids")
    parser.add_argument("--workers", type=int, default=4, help="simulated workers (default 4)")
    parser.add_argument(
        "--policies", default="kv,approx,round-robin,random",
        help="comma-separated, of: " + ", ".join(POLICIES) + " (default: all)",
    )
    parser.add_argument("--block-size", type=int, default=512, help="tokens per trace hash id (default 512)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random choices (default 0)")
    parser.add_argument(
        "--slow-worker-factor", type=float, default=1.0, help="worker 0 is this many times slower (default 1)"
    )
    parser.add_argument(
        "--time-scale", type=float, default=1.0,
        help="arrival-rate multiplier: timestamps are divided by it (default 1)",
    )
    parser.add_argument(
        "--kv-overlap-weight", type=float, default=8.0, help="kv/approx: prefill block weight (default 8)"
    )
    parser.add_argument("--router-temperature", type=float, default=0.0, help="kv/approx: softmax temperature")
    parser.add_argument("--busy-threshold", type=float, help="kv/approx: KV usage fraction that refuses requests")
    parser.add_argument("--engine-args", type=Path, help="JSON file of mocker settings (see docs/mocker.md)")
    parser.add_argument(
        "--num-gpu-blocks", type=int,
        help="KV cache of each worker, in engine blocks (overrides --engine-args; default 26,624 of 16 tokens: "
        "an 80 GB GPU serving an 8B model, see docs/kv-routing.md)",
    )
    parser.add_argument(
        "--jobs", type=int,
        help="policies replayed at once, each on its own core (default: one per policy, at most the CPU count)",
    )
    parser.add_argument("--limit", type=int, help="replay only the first N requests")
    parser.add_argument("--plot", type=Path, help="PNG of the TTFT CDFs (default: TRACE stem + _ttft.png)")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument("--json", type=Path, help="also write the reports (without samples) as JSON here")
    admission = parser.add_argument_group("the frontend's admission, per arrival (docs/reliability.md)")
    admission.add_argument("--max-inflight-requests", type=int, help="most requests in flight; more are refused")
    admission.add_argument("--max-queued-tokens", type=int, help="most prompt tokens waiting for a first token")
    admission.add_argument("--admission-ttft-ms", type=float,
                           help="refuse when the router's TTFT estimate for the best worker exceeds this")
    args = parser.parse_args(argv)
    for flag in ("max_inflight_requests", "max_queued_tokens", "admission_ttft_ms"):
        value = getattr(args, flag)
        if value is not None and value <= 0:
            parser.error(f"--{flag.replace('_', '-')} must be above 0, got {value}")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        parser.error(f"--policies: unknown {unknown}; choose from {', '.join(POLICIES)}")
    args.policies = policies
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if args.limit is not None and args.limit < 1:
        parser.error("--limit must be at least 1")
    if args.num_gpu_blocks is not None and args.num_gpu_blocks < 1:
        parser.error("--num-gpu-blocks must be at least 1")
    if args.jobs is None:
        args.jobs = max(1, min(len(policies), os.cpu_count() or 1))
    elif args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return args


def format_table(reports: Sequence[dict[str, Any]]) -> str:
    """The reports as an aligned text table."""
    rows = [[title for title, _, _ in COLUMNS]]
    rows += [[fmt.format(r[key]) for _, key, fmt in COLUMNS] for r in reports]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells))
    return "\n".join(lines)


def plot_ttft_cdfs(reports: Sequence[dict[str, Any]], path: Path, title: str) -> bool:
    """Write the TTFT CDF of each report to `path`; False (with a message) without matplotlib."""
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        print("matplotlib is not installed: no plot written (pip install matplotlib, or pass --no-plot)",
              file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in reports:
        samples = sorted(r["ttft_ms"])
        if samples:
            n = len(samples)
            ax.plot([s / 1000 for s in samples], [(i + 1) / n for i in range(n)], label=r["policy"])
    ax.set_xscale("log")
    ax.set_xlabel("time to first token (s, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def limited_trace(trace: Path, limit: int | None, scratch: Path) -> Path:
    """`trace`, or a copy of its first `limit` requests in `scratch`."""
    if limit is None:
        return trace
    with trace.open() as src, scratch.open("w") as dst:
        for i, line in enumerate(src):
            if i >= limit:
                break
            dst.write(line)
    return scratch


def engine_settings(args: argparse.Namespace) -> str | None:
    """The mocker settings as JSON: the ``--engine-args`` file with ``--num-gpu-blocks``
    applied, or None for the lab's defaults."""
    if args.num_gpu_blocks is None:
        return args.engine_args.read_text() if args.engine_args else None
    settings = json.loads(args.engine_args.read_text()) if args.engine_args else {}
    if not isinstance(settings, dict):
        raise ValueError(f"{args.engine_args}: the mocker settings must be a JSON object")
    settings["num_gpu_blocks"] = args.num_gpu_blocks
    return json.dumps(settings)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            engine_args = engine_settings(args)
            trace = limited_trace(args.trace, args.limit, Path(tmp) / "trace.jsonl")
        except (OSError, ValueError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

        def replay(policy: str) -> dict[str, Any]:
            # Runs without the GIL: the policies of one command replay in parallel.
            start = time.perf_counter()
            report = run_routing_lab(
                str(trace), policy, workers=args.workers, trace_block_size=args.block_size, seed=args.seed,
                slow_worker_factor=args.slow_worker_factor, time_scale=args.time_scale,
                overlap_weight=args.kv_overlap_weight, temperature=args.router_temperature,
                busy_threshold=args.busy_threshold, engine_args=engine_args,
                max_inflight_requests=args.max_inflight_requests, max_queued_tokens=args.max_queued_tokens,
                admission_ttft_ms=args.admission_ttft_ms,
            )
            report["wall_s"] = time.perf_counter() - start
            print(f"{policy}: {report['completed']}/{report['requests']} requests in "
                  f"{report['simulated_s']:.0f} simulated s ({report['wall_s']:.1f} s)", file=sys.stderr, flush=True)
            return report

        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(replay, policy) for policy in args.policies]
            try:
                reports = [future.result() for future in futures]
            except (OSError, ValueError) as e:
                for future in futures:
                    future.cancel()
                print(f"error: {e}", file=sys.stderr)
                return 2
    print(format_table(reports))
    if args.json:
        args.json.write_text(json.dumps([{k: v for k, v in r.items() if k != "ttft_ms"} for r in reports], indent=2))
    if not args.no_plot:
        path = args.plot or args.trace.with_name(args.trace.stem + "_ttft.png")
        title = f"{args.trace.name}: {args.workers} workers"
        if plot_ttft_cdfs(reports, path, title):
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

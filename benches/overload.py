"""Overload benchmark: a mocker fleet behind the frontend's admission limits, driven
open-loop at a multiple of its capacity (docs/performance.md, "Overload").

    python benches/overload.py                                   # 2 workers, 2x capacity
    python benches/overload.py --workers 2 --overload 2 --duration 20 --max-inflight-requests 8
    python benches/overload.py --router-mode kv --max-inflight-requests 0 --admission-ttft-ms 1000

Processes (started here on free loopback ports, embedded backend): ``python -m
dynamo.mocker --num-workers W`` and two frontends over it: ``dynamo-run in=http out=dyn``
without limits (to measure capacity) and the same with ``--max-inflight-requests N
[--max-queued-tokens T] [--admission-ttft-ms MS]`` (under test; ``--no-limit``: without
them, the baseline), both with ``--router-mode``. Each request is a streaming chat request
of about ``--prompt-words`` tokens asking ``--max-tokens`` tokens.

1. Capacity: a closed loop of ``--capacity-clients`` clients (enough to saturate the
   fleet) on the unlimited frontend for ``--duration`` seconds; capacity = completed
   requests per second.
2. Overload: Poisson arrivals at ``--overload`` x capacity for ``--duration`` seconds,
   each request on its own connection. Measured: admitted requests' TTFT p50/p99, the
   time until a refused request has its status (429/503) p50/p99, hangs (no status or
   no end within ``--request-timeout``), and goodput (completed requests per second) as
   a fraction of the capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llm_serving import DEFAULT_MODEL_PATH, DYNAMO_RUN, base_env
from serving_load import Processes, free_port, percentile, poisson_offsets, run_async, wait_for_models

MODEL = "overload"


@dataclass
class Outcome:
    """What the requests of one phase got."""

    seconds: float = 0.0
    completed: int = 0
    refused: int = 0
    failed: int = 0
    hangs: int = 0
    ttft: list[float] = field(default_factory=list)
    #: (seconds into the phase when sent, TTFT) of each admitted request of an open loop.
    ttft_at: list[tuple[float, float]] = field(default_factory=list)
    refusal: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)


def body(prompt_words: int, max_tokens: int, rng: random.Random) -> bytes:
    words = " ".join(f"w{rng.randrange(3, 200)}" for _ in range(prompt_words))
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": words}], "max_tokens": max_tokens,
                       "stream": True, "ignore_eos": True}).encode()


async def one(port: int, payload: bytes, outcome: Outcome, timeout: float, offset: float | None = None) -> None:
    """Send one request on a fresh connection; record its status, TTFT or refusal time
    (and, for a request sent `offset` seconds into its phase, when it was sent)."""
    start = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), timeout)
    except (OSError, asyncio.TimeoutError):
        outcome.failed += 1
        return
    try:
        head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n").encode()
        writer.write(head + payload)
        await writer.drain()

        async def read() -> None:
            status_line = await reader.readline()
            status = int(status_line.split()[1])
            outcome.statuses[status] = outcome.statuses.get(status, 0) + 1
            if status in (429, 503):
                outcome.refusal.append(time.perf_counter() - start)
                outcome.refused += 1
                return
            if status != 200:
                outcome.failed += 1
                return
            first = None
            async for line in reader:
                if first is None and line.startswith(b"data: {") and b'"content"' in line:
                    first = time.perf_counter() - start
                if b"data: [DONE]" in line:
                    break
            else:
                outcome.failed += 1
                return
            outcome.completed += 1
            if first is not None:
                outcome.ttft.append(first)
                if offset is not None:
                    outcome.ttft_at.append((offset, first))

        await asyncio.wait_for(read(), timeout)
    except asyncio.TimeoutError:
        outcome.hangs += 1
    except (OSError, ValueError, IndexError):
        outcome.failed += 1
    finally:
        writer.close()


async def closed_loop(port: int, clients: int, duration: float, payloads: list[bytes], timeout: float) -> Outcome:
    outcome = Outcome()
    start = time.perf_counter()

    async def client(i: int) -> None:
        n = i
        while time.perf_counter() - start < duration:
            await one(port, payloads[n % len(payloads)], outcome, timeout)
            n += clients

    await asyncio.gather(*(client(i) for i in range(clients)))
    outcome.seconds = time.perf_counter() - start
    return outcome


async def open_loop(port: int, rate: float, duration: float, payloads: list[bytes], timeout: float) -> Outcome:
    outcome = Outcome()
    offsets = [t for t in poisson_offsets(int(rate * duration * 2) + 1, rate, seed=1) if t < duration]
    start = time.perf_counter()

    async def at(offset: float, payload: bytes) -> None:
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        await one(port, payload, outcome, timeout, offset)

    await asyncio.gather(*(at(t, payloads[i % len(payloads)]) for i, t in enumerate(offsets)))
    outcome.seconds = time.perf_counter() - start
    return outcome


def ms(values: list[float], p: float) -> float:
    return round(percentile(values, p) * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="mocker workers (default 2)")
    parser.add_argument("--speedup-ratio", type=float, default=1.0, help="the mocker's speedup_ratio (default 1)")
    parser.add_argument("--num-gpu-blocks", type=int, default=256,
                        help="KV blocks per mocker worker (default 256: about 16 requests at once each, so that "
                             "the fleet saturates and its capacity is a number)")
    parser.add_argument("--max-inflight-requests", type=int, default=32, help="per-model limit (default 32; 0: none)")
    parser.add_argument("--max-queued-tokens", type=int, default=None, help="per-model limit (default none)")
    parser.add_argument("--admission-ttft-ms", type=int, default=None,
                        help="TTFT target: refuse at admission on the router's estimate (default none)")
    parser.add_argument("--router-mode", default="round-robin", help="the frontends' router mode (default round-robin)")
    parser.add_argument("--no-limit", action="store_true", help="baseline: the overload without admission limits")
    parser.add_argument("--capacity-clients", type=int, default=64,
                        help="closed-loop clients that measure capacity (default 64)")
    parser.add_argument("--overload", type=float, default=2.0, help="offered load / capacity (default 2)")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per phase (default 20)")
    parser.add_argument("--prompt-words", type=int, default=200, help="prompt size in tokens (default 200)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (default 32)")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="a hang after this (default 60 s)")
    parser.add_argument("--model-path", type=Path, default=DEFAULT_MODEL_PATH, help="tokenizer folder of the mocker")
    parser.add_argument("--settle-s", type=float, default=5.0,
                        help="also report the admitted TTFT of requests sent after this many seconds of overload "
                             "(the estimate's start-up transient left out; default 5)")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    if not (args.model_path / "tokenizer.json").is_file():
        raise SystemExit(f"{args.model_path} has no tokenizer.json: pass --model-path DIR")

    rng = random.Random(0)
    payloads = [body(args.prompt_words, args.max_tokens, rng) for _ in range(64)]
    with tempfile.TemporaryDirectory(prefix="overload-") as tmp:
        log_dir = Path(tmp)
        processes = Processes(log_dir)
        env = base_env(log_dir)
        port, open_port = free_port(), free_port()
        engine_args = log_dir / "mocker.json"
        engine_args.write_text(json.dumps({"speedup_ratio": args.speedup_ratio, "num_gpu_blocks": args.num_gpu_blocks}))
        limits = []
        if args.max_inflight_requests and not args.no_limit:
            limits += ["--max-inflight-requests", str(args.max_inflight_requests)]
        if args.max_queued_tokens and not args.no_limit:
            limits += ["--max-queued-tokens", str(args.max_queued_tokens)]
        if args.admission_ttft_ms and not args.no_limit:
            limits += ["--admission-ttft-ms", str(args.admission_ttft_ms)]
        routing = ["--router-mode", args.router_mode]
        try:
            processes.start("mockers", [sys.executable, "-m", "dynamo.mocker", "--model-path", str(args.model_path),
                                        "--model-name", MODEL, "--endpoint", "dyn://bench.mocker.generate",
                                        "--num-workers", str(args.workers), "--extra-engine-args", str(engine_args)],
                            env)
            processes.start("frontend", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port), *routing,
                                         *limits], env)
            processes.start("frontend-open", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(open_port),
                                              *routing], env)
            wait_for_models(port, [MODEL], processes)
            wait_for_models(open_port, [MODEL], processes)
            run_async(closed_loop(open_port, args.workers, 2.0, payloads, args.request_timeout))  # warm-up
            # The frontend under test times its workers too (its TTFT estimate starts there).
            run_async(closed_loop(port, args.workers, 2.0, payloads, args.request_timeout))
            capacity_run = run_async(closed_loop(open_port, args.capacity_clients, args.duration, payloads,
                                                 args.request_timeout))
            capacity = capacity_run.completed / capacity_run.seconds
            rate = args.overload * capacity
            print(f"capacity: {capacity:.1f} req/s with {args.capacity_clients} clients "
                  f"(TTFT p99 {ms(capacity_run.ttft, 99)} ms); offering {rate:.1f} req/s for {args.duration:.0f} s")
            over = run_async(open_loop(port, rate, args.duration, payloads, args.request_timeout))
        finally:
            processes.stop()
        figures: dict[str, Any] = {
            "workers": args.workers,
            "router_mode": args.router_mode,
            "max_inflight_requests": None if args.no_limit else (args.max_inflight_requests or None),
            "admission_ttft_ms": None if args.no_limit else args.admission_ttft_ms,
            "capacity_clients": args.capacity_clients,
            "capacity_req_per_s": round(capacity, 2),
            "capacity_ttft_p99_ms": ms(capacity_run.ttft, 99),
            "offered_req_per_s": round(rate, 2),
            "sent": over.completed + over.refused + over.failed + over.hangs,
            "completed": over.completed,
            "refused": over.refused,
            "failed": over.failed,
            "hangs": over.hangs,
            "statuses": over.statuses,
            "admitted_ttft_p50_ms": ms(over.ttft, 50),
            "admitted_ttft_p99_ms": ms(over.ttft, 99),
            "settle_s": args.settle_s,
            "admitted_ttft_p99_after_settle_ms": ms([t for at, t in over.ttft_at if at >= args.settle_s], 99),
            "admitted_ttft_p99_first_settle_ms": ms([t for at, t in over.ttft_at if at < args.settle_s], 99),
            "refusal_p50_ms": ms(over.refusal, 50),
            "refusal_p99_ms": ms(over.refusal, 99),
            "goodput_req_per_s": round(over.completed / over.seconds, 2),
            "goodput_vs_capacity": round(over.completed / over.seconds / capacity, 3),
        }
        print(json.dumps(figures, indent=2))
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

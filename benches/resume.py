"""Resumable streams against a mocker fleet (docs/performance.md, "Resumable streams").

Each trial sends a seeded streamed completion with ``X-Dynamo-Resumable: true``, cuts
the connection at a random event, waits a random delay (under ``--max-reconnect-s``),
and resumes with ``Last-Event-ID``; in ``--kill-fraction`` of the trials a worker is
killed (SIGKILL) while the client is away and a replacement is started. Each trial's
joined output must be byte-identical to an uninterrupted run with the same seed, with
no event duplicated or missing. Reported: failures, resume latency (resume sent → first
event), the largest stream in bytes (what its replay buffer holds at most, itself capped
at ``--stream-buffer-bytes``), and the frontend's migration count.

    python benches/resume.py --trials 1000 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "tests" / "faults"))

from llm_helpers import MOCKER, write_model_dir  # noqa: E402
from llm_serving import DYNAMO_RUN, base_env  # noqa: E402
from resume_client import content, read_all, request, resumable_run  # noqa: E402
from serving_load import Processes, free_port, percentile, wait_for_models  # noqa: E402

ENDPOINT = "bench.mocker.generate"
#: Words of the test model's vocabulary (w3, w4, …); generated tokens are drawn from them.
PROMPT = " ".join(f"w{i}" for i in range(3, 40))


def body(model: str, seed: int, max_tokens: int) -> dict:
    return {"model": model, "prompt": PROMPT, "stream": True, "max_tokens": max_tokens, "seed": seed}


def migrations(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynamo_frontend_migrations_total"))


class Fleet:
    def __init__(self, processes: Processes, env: dict[str, str], model_dir: Path, speedup: float):
        self.processes, self.env, self.model_dir, self.speedup = processes, env, model_dir, speedup
        self.workers: list = []
        self.started = 0

    def start_worker(self) -> None:
        argv = [*MOCKER, "--model-path", str(self.model_dir), "--endpoint", ENDPOINT,
                "--speedup-ratio", str(self.speedup)]
        self.started += 1
        self.workers.append(self.processes.start(f"mocker-{self.started}", argv, self.env))

    def kill_one(self, rng: random.Random) -> None:
        victim = self.workers.pop(rng.randrange(len(self.workers)))
        victim.kill()
        victim.wait(timeout=10)
        self.start_worker()


async def main(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="resume-bench-") as tmp:
        base = Path(tmp)
        env = base_env(base)
        env.update({"DYN_LEASE_TTL": "2", "DYN_TCP_PING_INTERVAL": "0.5", "DYN_TCP_PEER_TIMEOUT": "2"})
        model_dir = write_model_dir(base / "model")
        processes = Processes(base)
        fleet = Fleet(processes, env, model_dir, args.speedup_ratio)
        try:
            for _ in range(args.workers):
                fleet.start_worker()
            port = free_port()
            processes.start("frontend", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-host", "127.0.0.1",
                                         "--http-port", str(port), "--stream-buffer-bytes",
                                         str(args.stream_buffer_bytes)], env)
            wait_for_models(port, [model_dir.name], processes)
            seeds = list(range(args.seeds))
            reference = {}
            for seed in seeds:
                events = await read_all(await request(port, "POST", "/v1/completions",
                                                      body(model_dir.name, seed, args.max_tokens)))
                reference[seed] = content(events)
            return await run_trials(args, rng, port, fleet, model_dir.name, reference)
        finally:
            processes.stop()


async def run_trials(args: argparse.Namespace, rng: random.Random, port: int, fleet: Fleet, model: str,
                     reference: dict[int, str]) -> dict:
    latencies: list[float] = []
    failures: list[str] = []
    stream_bytes: list[int] = []
    kills = 0
    kill_lock = asyncio.Lock()
    migrations_before = migrations(port)
    queue = list(range(args.trials))
    started = time.monotonic()

    async def trial(index: int) -> None:
        nonlocal kills
        seed = rng.choice(list(reference))
        cut_after = rng.randrange(1, args.max_tokens)
        delay = rng.uniform(0, args.max_reconnect_s)
        kill = rng.random() < args.kill_fraction

        async def away() -> None:
            nonlocal kills
            if kill:
                async with kill_lock:
                    await asyncio.to_thread(fleet.kill_one, rng)
                    kills += 1
            await asyncio.sleep(delay)

        try:
            events, latency = await resumable_run(port, "/v1/completions", body(model, seed, args.max_tokens),
                                                  f"bench-{index}-{rng.getrandbits(32):08x}", cut_after, away)
        except Exception as e:  # every failure is counted and reported
            failures.append(f"trial {index}: {type(e).__name__}: {e}")
            return
        ids = [e.id for e in events]
        if ids != list(range(len(ids))):
            failures.append(f"trial {index}: ids {ids[:10]}… not 0..{len(ids) - 1}")
        elif events[-1].data != "[DONE]":
            failures.append(f"trial {index}: no [DONE]: {events[-1].data[:200]}")
        elif content(events) != reference[seed]:
            failures.append(f"trial {index}: output differs from the uninterrupted run (seed {seed})")
        else:
            latencies.append(latency)
            stream_bytes.append(sum(len(e.data) for e in events))

    async def client() -> None:
        while queue:
            await trial(queue.pop())

    await asyncio.gather(*(client() for _ in range(args.concurrency)))
    seconds = time.monotonic() - started
    return {
        "trials": args.trials,
        "ok": len(latencies),
        "failed": len(failures),
        "first_failures": failures[:5],
        "worker_kills": kills,
        "migrations": migrations(port) - migrations_before,
        "resume_latency_p50_ms": percentile(latencies, 50) * 1000 if latencies else None,
        "resume_latency_p99_ms": percentile(latencies, 99) * 1000 if latencies else None,
        "largest_stream_bytes": max(stream_bytes, default=0),
        "stream_buffer_bytes": args.stream_buffer_bytes,
        "seconds": seconds,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--kill-fraction", type=float, default=0.1)
    parser.add_argument("--max-reconnect-s", type=float, default=1.0, help="reconnect within this (the issue: 5 s)")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--seeds", type=int, default=20, help="distinct seeded requests (references)")
    parser.add_argument("--speedup-ratio", type=float, default=0.5, help="the mocker's timing divisor")
    parser.add_argument("--stream-buffer-bytes", type=int, default=65536)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args())), indent=2))

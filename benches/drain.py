"""Draining a worker under load (docs/reliability.md, "Drain and resume"; figures in
docs/performance.md, "Drain").

A mocker fleet (``--workers``, each with its system server) behind one frontend with its
defaults (migration on, limit 3) serves ``--concurrency`` closed-loop clients, each
sending seeded streamed completions. After ``--warmup-s`` one worker is drained with
``POST /drain {"deadline_s": …}``; the load goes on for ``--after-s``. Reported:

- ``leave_routing_ms``: from the drain call until the worker's instance is gone from
  discovery (as a client of the runtime sees it; the frontend's watch is the same kind);
- ``served_after_drain``: requests the drained worker received after the call returned
  (its endpoint counter): must be 0;
- ``failed``: requests that did not complete with text byte-identical to the
  uninterrupted run of the same seed (status, error chunk, or different text): must be 0;
- ``cut`` and ``migrations``: streams the deadline ended, and the frontend's migrations.

    python benches/drain.py --workers 3 --concurrency 24 --deadline-s 1
    python benches/drain.py --backend etcd     # etcd discovery, NATS planes (local servers)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
from resume_client import content, read_all, request  # noqa: E402
from serving_load import Processes, free_port, start_etcd, start_nats, wait_for_models  # noqa: E402

ENDPOINT = "bench.mocker.generate"
#: Words of the test model's vocabulary (w3, w4, …); generated tokens are drawn from them.
PROMPT = " ".join(f"w{i}" for i in range(3, 40))
#: Bound on one admin or metrics call.
CALL_TIMEOUT = 10.0


def body(model: str, seed: int, max_tokens: int) -> dict:
    # ignore_eos: every stream is max_tokens long (the mocker may draw the EOS token).
    return {"model": model, "prompt": PROMPT, "stream": True, "max_tokens": max_tokens, "seed": seed,
            "ignore_eos": True}


def http(port: int, method: str, path: str, payload: dict | None = None) -> bytes:
    data = json.dumps(payload).encode() if payload is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=CALL_TIMEOUT) as response:
        return response.read()


def served(system_port: int) -> float:
    text = http(system_port, "GET", "/metrics").decode()
    found = re.search(r'^dynamo_endpoint_requests_total\{[^}]*endpoint="generate"[^}]*\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def migrations(port: int) -> float:
    text = http(port, "GET", "/metrics").decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynamo_frontend_migrations_total"))


async def main(args: argparse.Namespace) -> dict:
    from dynamo.runtime import DistributedRuntime

    with tempfile.TemporaryDirectory(prefix="drain-bench-") as tmp:
        base = Path(tmp)
        env = base_env(base)
        model_dir = write_model_dir(base / "model")
        processes = Processes(base)
        if args.backend == "etcd":
            # etcd discovery, NATS request and event planes, on servers of this run alone.
            env.update({"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": start_etcd(processes, base),
                        "NATS_SERVER": start_nats(processes, base), "DYN_REQUEST_PLANE": "nats",
                        "DYN_EVENT_PLANE": "nats"})
            env.pop("DYN_FILE_KV")
        # This process's runtime (it watches discovery) joins the same fleet.
        os.environ.update({k: v for k, v in env.items()
                           if k.startswith("DYN_") or k in ("ETCD_ENDPOINTS", "NATS_SERVER")})
        runtime = DistributedRuntime(asyncio.get_running_loop(), False)
        try:
            system_ports = []
            for i in range(args.workers):
                port = free_port()
                system_ports.append(port)
                argv = [*MOCKER, "--model-path", str(model_dir), "--endpoint", ENDPOINT,
                        "--speedup-ratio", str(args.speedup_ratio)]
                processes.start(f"mocker-{i}", argv, {**env, "DYN_SYSTEM_ENABLED": "true",
                                                      "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port)})
            client = await runtime.endpoint(ENDPOINT).client()
            deadline = time.monotonic() + 60
            while len(client.instance_ids()) < args.workers:
                processes.check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{len(client.instance_ids())} of {args.workers} workers registered")
                await asyncio.sleep(0.1)
            port = free_port()
            processes.start("frontend", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-host", "127.0.0.1",
                                         "--http-port", str(port)], env)
            wait_for_models(port, [model_dir.name], processes)
            return await measure(args, port, model_dir.name, system_ports, client)
        finally:
            await runtime.shutdown()
            processes.stop()


async def measure(args: argparse.Namespace, port: int, model: str, system_ports: list[int], client) -> dict:
    reference = {}
    for seed in range(args.seeds):
        reference[seed] = content(await read_all(await request(port, "POST", "/v1/completions",
                                                                body(model, seed, args.max_tokens))))
    failures: list[str] = []
    ok = 0
    stop_at = [float("inf")]

    async def one(seed: int) -> None:
        nonlocal ok
        try:
            events = await read_all(await request(port, "POST", "/v1/completions", body(model, seed, args.max_tokens)))
            text = content(events)
        except Exception as e:  # every failure is counted and reported
            failures.append(f"seed {seed}: {type(e).__name__}: {e}")
            return
        if not events or events[-1].data != "[DONE]":
            failures.append(f"seed {seed}: no [DONE]")
        elif text != reference[seed]:
            failures.append(f"seed {seed}: output differs from the uninterrupted run")
        else:
            ok += 1

    async def client_loop(index: int) -> None:
        n = index
        while time.monotonic() < stop_at[0]:
            await one(n % args.seeds)
            n += args.concurrency

    migrations_before = migrations(port)
    loops = [asyncio.create_task(client_loop(i)) for i in range(args.concurrency)]
    await asyncio.sleep(args.warmup_s)
    drained_port = system_ports[0]
    instances_before = set(client.instance_ids())
    inflight_at_drain = json.loads(http(drained_port, "GET", "/state"))["inflight"]
    called = time.monotonic()
    answer = json.loads(await asyncio.to_thread(http, drained_port, "POST", "/drain", {"deadline_s": args.deadline_s}))
    returned = time.monotonic()
    served_at_drain = served(drained_port)
    while len(set(client.instance_ids())) == len(instances_before):
        if time.monotonic() - called > 30:
            raise RuntimeError("the drained worker did not leave discovery within 30 s")
        await asyncio.sleep(0.002)
    left = time.monotonic()
    stop_at[0] = time.monotonic() + args.after_s
    await asyncio.gather(*loops)
    state = json.loads(http(drained_port, "GET", "/state"))
    return {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "deadline_s": args.deadline_s,
        "requests_ok": ok,
        "failed": len(failures),
        "first_failures": failures[:5],
        "inflight_on_drained_worker_at_drain": inflight_at_drain,
        "drain_call_ms": (returned - called) * 1000,
        "leave_routing_ms": (left - called) * 1000,
        "served_after_drain": served(drained_port) - served_at_drain,
        "cut": state["cut"],
        "migrations": migrations(port) - migrations_before,
        "drain_answer": answer,
        "state_after": state,
    }


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["embedded", "etcd"], default="embedded",
                        help="embedded: file discovery, TCP planes; etcd: etcd discovery, NATS planes")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=24)
    parser.add_argument("--deadline-s", type=float, default=1.0, help="the drain's deadline")
    parser.add_argument("--warmup-s", type=float, default=3.0, help="load before the drain")
    parser.add_argument("--after-s", type=float, default=5.0, help="load after the worker left routing")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=8, help="distinct seeded requests (references)")
    parser.add_argument("--speedup-ratio", type=float, default=0.2, help="the mocker's timing divisor")
    return parser.parse_args()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args())), indent=2))

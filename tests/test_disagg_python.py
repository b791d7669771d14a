"""Disaggregated serving with a Python engine (tests/workers/handoff_engine_worker.py,
behind the interface the vLLM worker uses: dynamo.llm.disagg) in real processes on both
backends: the core's rule sends long prompts to the prefill worker and keeps short ones
local; the prefill engine's transfer parameters reach the decode engine intact; a
failing prefill and a prefill worker SIGKILLed mid-job end in local prefills, bounded."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import WORKERS_DIR, WorkerPool, WorkerProcess, free_port, wait_until
from llm_helpers import start_frontend
from test_disagg import MAX_LOCAL, Graph, client, long_completion, prompt, wait_metric

pytestmark = pytest.mark.timeout(150)

WORKER = WORKERS_DIR / "handoff_engine_worker.py"
#: `prompt(FAILING_PROMPT, n)` starts with `w900`, which the test engine's prefill refuses.
FAILING_PROMPT = 897


def engine(pool: WorkerPool, role: str, endpoint: str, model_dir: Path, port: int, *args: str) -> WorkerProcess:
    env = {**pool.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port)}
    return pool.spawn(WORKER, "--role", role, "--endpoint", endpoint, "--model-path", str(model_dir), *args, env=env)


async def start_graph(pool: WorkerPool, namespace: str, model_dir: Path, prefill_args: tuple[str, ...] = (),
                      decode_args: tuple[str, ...] = ()) -> Graph:
    prefill_port, decode_port = free_port(), free_port()
    prefill = engine(pool, "prefill", f"{namespace}.prefill.generate", model_dir, prefill_port, *prefill_args)
    await prefill.wait_ready()
    decode = engine(pool, "decode", f"{namespace}.backend.generate", model_dir, decode_port,
                    "--max-local-prefill-length", str(MAX_LOCAL), *decode_args)
    await decode.wait_ready()
    transport = "jetstream" if pool.env.get("DYN_EVENT_PLANE") == "nats" else "request_plane"
    assert decode.find_lines("TRANSPORT") == [f"TRANSPORT {transport}"]
    frontend = await start_frontend(pool, "dyn")
    await frontend.wait_models([model_dir.name])
    return Graph(prefill, prefill_port, decode, decode_port, frontend)


async def lines(worker: WorkerProcess, prefix: str, count: int, timeout: float = 10.0) -> list[str]:
    """The worker's `PREFIX ...` lines once there are `count` of them (its output is read
    by a thread, a moment after it is written)."""
    found: list[str] = []

    def enough() -> list[str] | None:
        nonlocal found
        found = worker.find_lines(prefix + " ")
        return found if len(found) >= count else None

    return await wait_until(
        enough, timeout, lambda: f"{count} {prefix} lines (have {len(found)}): {worker.describe()}"
    )


async def params_lines(worker: WorkerProcess, prefix: str, count: int) -> list[Any]:
    """The JSON of the `count` `PREFIX <request id> <json>` lines."""
    return [json.loads(line.split(" ", 2)[2]) for line in await lines(worker, prefix, count)]


async def test_python_engine_prefills_remotely_by_the_core_rule(
    workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    graph = await start_graph(workers, namespace, model_dir)
    c = client(graph.frontend)
    try:
        for i in range(3):
            short = await c.completions.create(model=model_dir.name, prompt=prompt(i * 10, 8), max_tokens=4)
            assert short.choices[0].finish_reason == "length" and short.usage is not None
            assert short.usage.completion_tokens == 4
        assert (graph.prefills("local"), graph.prefills("remote")) == (3, 0)
        assert len(await lines(graph.decode, "LOCAL", 3)) == 3

        for i in range(3):
            stream = await c.completions.create(
                model=model_dir.name, prompt=prompt(100 + i * 200, 3 * MAX_LOCAL), max_tokens=5, stream=True,
            )
            chunks = [chunk async for chunk in stream]
            reasons = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
            assert reasons == ["length"], chunks
        assert (graph.prefills("remote"), graph.prefills("local"), graph.prefills("fallback")) == (3, 3, 0)
        assert graph.jobs("done") == 3
        # What the prefill engine returned is what the decode engine received, key for key.
        sent, received = await params_lines(graph.prefill, "PARAMS", 3), await params_lines(graph.decode, "RECEIVED", 3)
        assert len(sent) == len(received) == 3
        assert sorted(map(json.dumps, sent)) == sorted(map(json.dumps, received))
        assert received[0]["nested"]["unicode"] == "préfill ✓" and received[0]["nested"]["deep"]["x"][3] is False
        assert received[0]["pid"] == graph.prefill.pid

        # The same long prompt again: the decode engine cached it (its KV events, followed
        # by the worker's own index, say so), so the uncached part is short and stays local.
        again = await c.completions.create(model=model_dir.name, prompt=prompt(100, 3 * MAX_LOCAL), max_tokens=2)
        assert again.choices[0].finish_reason == "length"
        cached = [int(line.split()[1]) for line in await lines(graph.decode, "CACHED", 7)]
        assert cached[:6] == [0] * 6 and cached[6] >= 3 * MAX_LOCAL - 16, (cached, graph.decode.describe())
        assert (graph.prefills("remote"), graph.prefills("local")) == (3, 4)

        # A prefill the engine raises on: the job fails, the decode worker prefills locally.
        failing = await c.completions.create(
            model=model_dir.name, prompt=prompt(FAILING_PROMPT, 3 * MAX_LOCAL), max_tokens=2
        )
        assert failing.choices[0].finish_reason == "length"
        assert (graph.jobs("failed"), graph.prefills("fallback")) == (1, 1)
        assert graph.prefills("remote") == 3
    finally:
        await c.close()


async def test_python_prefill_worker_killed_mid_job_is_bounded(
    workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    graph = await start_graph(
        workers, namespace, model_dir, prefill_args=("--prefill-delay", "30"),
        decode_args=("--max-prefill-queue-size", "100", "--remote-prefill-timeout", "8"),
    )
    c = client(graph.frontend)
    try:
        started = time.monotonic()
        requests = [asyncio.create_task(long_completion(c, model_dir.name, i)) for i in range(4)]
        await graph.prefill.wait_for_line("PREFILLING", 20)
        graph.prefill.kill()  # SIGKILL while it computes (and holds) jobs
        outcomes = await asyncio.wait_for(asyncio.gather(*requests), timeout=40)
        elapsed = time.monotonic() - started
        # Every request ended, bounded by the remote prefill timeout, by a local prefill.
        assert outcomes == ["length"] * 4, outcomes
        assert elapsed < 40
        await wait_metric(graph.decode_port, "dynamo_disagg_prefills_total", 'source="fallback"', 1)
        assert graph.prefills("remote") == 0
        assert graph.prefills("fallback") + graph.prefills("local") == 4
        assert graph.decode.find_lines("RECEIVED") == []

        # With no prefill worker, the decode worker prefills locally at once.
        after = await asyncio.wait_for(
            c.completions.create(model=model_dir.name, prompt=prompt(500, 3 * MAX_LOCAL), max_tokens=2), timeout=30
        )
        assert after.choices[0].finish_reason == "length"
    finally:
        await c.close()


async def test_a_prefill_given_up_is_cancelled_in_python(workers: WorkerPool, namespace: str, model_dir: Path) -> None:
    """The decode worker stops waiting (its timeout): the request completes by a local
    prefill, and the prefill worker's coroutine is cancelled (request plane: the job's
    stream ends; both: the job's deadline passes)."""
    graph = await start_graph(
        workers, namespace, model_dir, prefill_args=("--prefill-delay", "30"),
        decode_args=("--remote-prefill-timeout", "1"),
    )
    c = client(graph.frontend)
    try:
        started = time.monotonic()
        answer = await asyncio.wait_for(
            c.completions.create(model=model_dir.name, prompt=prompt(300, 3 * MAX_LOCAL), max_tokens=2), timeout=20
        )
        assert answer.choices[0].finish_reason == "length"
        assert time.monotonic() - started < 15
        assert (graph.prefills("fallback"), graph.prefills("remote")) == (1, 0)
        # The prefill worker stops at the job's deadline (on the request plane, the
        # decode worker's giving up may end the job first).
        await lines(graph.prefill, "CANCELLED", 1)
        assert graph.jobs("done") == 0 and graph.prefill.find_lines("PARAMS") == []
        if workers.env.get("DYN_EVENT_PLANE") == "nats":
            await wait_metric(graph.prefill_port, "dynamo_disagg_prefill_jobs_total", 'outcome="expired"', 1)
    finally:
        await c.close()


async def test_disagg_bindings_reject_bad_arguments(runtime: Any, namespace: str) -> None:
    from dynamo._core import ConfigError
    from dynamo.llm import RemotePrefill, serve_prefill_worker

    endpoint = runtime.namespace(namespace).component("backend").endpoint("generate")
    with pytest.raises(ValueError, match="remote_prefill_timeout"):
        await RemotePrefill.connect(endpoint, remote_prefill_timeout=0)
    with pytest.raises(ConfigError, match="not an endpoint path"):
        await RemotePrefill.connect(endpoint, prefill_endpoint="just-a-name")
    with pytest.raises(TypeError, match="async function"):
        await serve_prefill_worker(endpoint, "not callable", block_size=16)
    with pytest.raises(ValueError, match="block_size"):
        await serve_prefill_worker(endpoint, lambda r, c: None, block_size=0)

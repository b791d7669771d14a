"""Scale to zero in real processes (embedded backend): a frontend with `--keep-models`
keeps a model listed after its last worker leaves; a request for it waits (bounded) for
a worker and is served when one comes, or gets 503 + `Retry-After` when the bound passes,
and each such request is counted as demand. A kept model is recorded in discovery, so a
frontend started while the fleet is at zero (a cold frontend) lists it and serves its
first request the same way. The planner (local connector, min 0, `scale_to_zero`) reads
that demand, starts a mocker worker, and the waiting request is served; with no demand
left it goes back to zero workers."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import WorkerPool, wait_until
from llm_helpers import (
    MOCKER,
    Frontend,
    Planner,
    Response,
    chat_body,
    launch_frontend,
    post_json,
    start_mocker,
)

embedded_only = pytest.mark.parametrize("backend", ["embedded"], indirect=True)

#: Bound on a worker (or a model) appearing, and on the planner's passes.
BOUND = 60.0


async def keep_models_frontend(workers: WorkerPool, wait_s: float) -> Frontend:
    args = ("--http-host", "127.0.0.1", "--keep-models", "--zero-wait-s", str(wait_s))
    frontend = launch_frontend(workers, "dyn", *args)
    await frontend.wait_live()
    return frontend


async def register_then_leave(workers: WorkerPool, endpoint: str, model_dir: Path, *frontends: Frontend) -> None:
    """A worker registers the model (every frontend lists it), then stops; the model
    stays listed."""
    worker = start_mocker(workers, endpoint, model_dir, name="first-worker")
    for frontend in frontends:
        await frontend.wait_models([model_dir.name], timeout=BOUND)
    worker.send_signal(signal.SIGTERM)
    assert await worker.wait_exit(30) == 0, worker.describe()
    for frontend in frontends:
        assert frontend.models() == [model_dir.name], "a kept model stays listed with zero workers"


def metric(frontend: Frontend, name: str, model: str) -> float:
    """The value of `name{model=...}` on the frontend's /metrics (0 when absent)."""
    for line in frontend.get("/metrics").body.decode().splitlines():
        if line.startswith(f'{name}{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def refused_for_no_worker(frontend: Frontend, model: str) -> tuple[Response, float]:
    """A request that meets the zero-worker path (the frontend may take a moment to see
    the last worker go: until then a request fails on the gone instance instead)."""
    last: list[tuple[Response, float]] = []

    async def refused() -> bool:
        start = time.monotonic()
        response = await asyncio.to_thread(frontend.post, "/v1/chat/completions", chat_body(model, "hello"), 30)
        last.append((response, time.monotonic() - start))
        return response.status == 503 and b"has no worker" in response.body

    await wait_until(refused, 30, lambda: f"a zero-worker refusal (last: {last[-1:]})")
    return last[-1]


@embedded_only
@pytest.mark.timeout(180)
async def test_a_kept_model_waits_for_a_worker_or_refuses_with_retry_after(
    backend: Any, workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    endpoint = f"{namespace}.mocker.generate"
    model = model_dir.name
    short = await keep_models_frontend(workers, 2)
    long = await keep_models_frontend(workers, BOUND)
    await register_then_leave(workers, endpoint, model_dir, short, long)

    # Past the bound: 503 with Retry-After, naming the model; counted as demand.
    response, waited = await refused_for_no_worker(short, model)
    assert response.headers.get("retry-after") == "1", response.headers
    assert json.loads(response.body)["error"]["message"].startswith(f"model '{model}' has no worker")
    assert waited >= 1.9, f"refused after {waited:.2f}s: it did not wait for the 2 s bound"
    assert metric(short, "dynamo_frontend_requests_without_workers_total", model) >= 1
    assert metric(short, "dynamo_frontend_requests_waiting_for_workers", model) == 0

    # Within the bound: the request waits (visible as a waiting request), a worker comes,
    # and it is served.
    again = chat_body(model, "again", max_tokens=8)
    waiting = asyncio.create_task(asyncio.to_thread(post_json, long.port, "/v1/chat/completions", again, BOUND + 10))
    await wait_until(lambda: metric(long, "dynamo_frontend_requests_waiting_for_workers", model) == 1, 20,
                     "the request to wait for a worker", ignore=(OSError,))
    start_mocker(workers, endpoint, model_dir, name="second-worker")
    served = await asyncio.wait_for(waiting, BOUND + 20)
    assert served.status == 200, served.body[:500]
    assert json.loads(served.body)["usage"]["completion_tokens"] > 0, served.body[:500]
    assert metric(long, "dynamo_frontend_requests_waiting_for_workers", model) == 0


@pytest.mark.timeout(180)
async def test_a_cold_frontend_lists_a_kept_model_and_serves_its_first_request(
    backend: Any, workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    """The fleet goes to zero, every frontend restarts: a frontend with `--keep-models`
    lists the model from its record before any worker registers, and its first request
    waits (counted as demand) and is served once a worker comes. Without `--keep-models`
    a frontend does not list it."""
    endpoint = f"{namespace}.mocker.generate"
    model = model_dir.name
    first = await keep_models_frontend(workers, BOUND)
    await register_then_leave(workers, endpoint, model_dir, first)
    first.process.send_signal(signal.SIGTERM)
    assert await first.process.wait_exit(30) == 0, first.process.describe()

    cold = await keep_models_frontend(workers, BOUND)
    await cold.wait_models([model], timeout=20)  # no worker runs: listed from the record
    plain = launch_frontend(workers, "dyn", "--http-host", "127.0.0.1")
    await plain.wait_live()
    assert plain.models() == [], "a frontend without --keep-models lists only registered models"

    body = chat_body(model, "wake", max_tokens=8)
    waiting = asyncio.create_task(asyncio.to_thread(post_json, cold.port, "/v1/chat/completions", body, BOUND + 10))
    await wait_until(lambda: metric(cold, "dynamo_frontend_requests_waiting_for_workers", model) == 1, 20,
                     "the request to wait for a worker", ignore=(OSError,))
    assert metric(cold, "dynamo_frontend_requests_without_workers_total", model) == 1
    start_mocker(workers, endpoint, model_dir, name="worker-after-restart")
    served = await asyncio.wait_for(waiting, BOUND + 20)
    assert served.status == 200, served.body[:500]
    assert json.loads(served.body)["usage"]["completion_tokens"] > 0, served.body[:500]
    assert metric(cold, "dynamo_frontend_requests_waiting_for_workers", model) == 0
    await plain.wait_models([model], timeout=BOUND)  # registered now: every frontend lists it


def planner_config(path: Path, model_dir: Path, endpoint: str, frontend_port: int) -> Path:
    command = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint]
    config = {
        "model": model_dir.name,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": 2000}, "itl": {"quantile": 0.9, "ms": 500}},
        "roles": {"agg": {"min_replicas": 0, "max_replicas": 2, "endpoint": endpoint, "command": command}},
        "scale_to_zero": True,
        "intervals": {"load_s": 1.0, "throughput_s": 30},
        "stale_after_s": 5,
        "connector": {"kind": "local", "stop_timeout_s": 20},
    }
    path.write_text(json.dumps(config))
    return path


@embedded_only
@pytest.mark.timeout(240)
async def test_the_planner_starts_a_worker_for_a_request_at_zero_and_returns_to_zero(
    backend: Any, workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    endpoint = f"{namespace}.mocker.generate"
    model = model_dir.name
    frontend = await keep_models_frontend(workers, BOUND)
    await register_then_leave(workers, endpoint, model_dir, frontend)

    planner = Planner(workers, planner_config(tmp_path / "planner.yaml", model_dir, endpoint, frontend.port))
    fleet, describe = planner.fleet, planner.describe

    # At zero with no demand the planner holds: nothing starts.
    await wait_until(lambda: planner.health().get("signals", {}).get("frontend_metrics", {}).get("state")
                     == "ok", BOUND, describe, interval=0.2, ignore=(OSError, ValueError))
    assert fleet() == {"ready": 0, "pending": 0}, describe()

    # The first request waits; the planner sees it and starts a worker; it is served.
    start = time.monotonic()
    wake = chat_body(model, "wake", max_tokens=8)
    response = await asyncio.to_thread(post_json, frontend.port, "/v1/chat/completions", wake, BOUND + 10)
    assert response.status == 200, f"{response.status} {response.body[:500]!r}\n{describe()}"
    assert time.monotonic() - start < BOUND
    assert "demand at zero replicas: start one" in planner.process.describe(), describe()  # its log, on stderr

    # No demand left: back to zero, the model still listed.
    await wait_until(lambda: fleet() == {"ready": 0, "pending": 0}, BOUND, describe, interval=0.2,
                     ignore=(OSError, ValueError))
    assert frontend.models() == [model]

    await planner.stop()

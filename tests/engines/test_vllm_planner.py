"""The planner's local connector over real vLLM workers (embedded backend): the fleet
scaled to zero, a stream that waits at zero while the planner starts a
``python -m dynamo.vllm`` worker (its system server's ``/ready`` says when vLLM
answers), and the planner's own stop draining that worker with a stream in flight.

The model is registered once by a worker the test starts and stops (a frontend with
``--keep-models`` lists it with no worker from then on), so the planner starts from zero
with a model it can see demand for. Everything else the planner does at zero and at a
drain is the same with the mocker (``tests/test_scale_to_zero.py``, the real-process
planner tests); this module checks it with the engine users run, whose start takes tens
of seconds rather than one.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from engine_fleet import (
    ENGINE_FLAGS,
    ENGINE_START_TIMEOUT,
    MODEL,
    Fleet,
    StreamInFlight,
    engine_env,
    fleet_env,
    stop_all,
    whole_completion_stream,
)
from helpers import WorkerPool, wait_until
from llm_helpers import Planner, post_json

pytestmark = pytest.mark.timeout(600)

#: The prompt both workers answer (temperature 0: the same tokens from the same weights).
PROMPT = "The planner started this worker because"


def planner_config(path: Path, fleet: Fleet, frontend_port: int) -> Path:
    """A planner that may scale the fleet to zero and grow it to one vLLM worker. Its
    targets are loose (the CPU engine is slow): only demand at zero makes it act."""
    command = [
        sys.executable, "-m", "dynamo.vllm", "--model", str(fleet.model), "--served-model-name", MODEL,
        "--endpoint", fleet.endpoint, *ENGINE_FLAGS,
    ]
    config = {
        "model": MODEL,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": 60_000}, "itl": {"quantile": 0.9, "ms": 5_000}},
        "roles": {"agg": {
            "min_replicas": 0, "max_replicas": 1, "endpoint": fleet.endpoint.removeprefix("dyn://"),
            "command": command,
        }},
        "scale_to_zero": True,
        "intervals": {"load_s": 1.0, "throughput_s": 30},
        "stale_after_s": 5,
        "connector": {
            "kind": "local", "stop_timeout_s": 60, "ready_timeout_s": ENGINE_START_TIMEOUT,
            "env": engine_env({}),
        },
    }
    path.write_text(json.dumps(config))
    return path


def complete(port: int, timeout: float) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "temperature": 0}
    resp = post_json(port, "/v1/completions", body, timeout=timeout)
    assert resp.status == 200, resp.body[:500]
    return resp.json()


async def test_the_planner_starts_a_vllm_worker_for_a_request_at_zero_and_drains_it_when_it_stops(
    request: pytest.FixtureRequest, tiny_model: Path, tmp_path: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    fleet = Fleet(WorkerPool(fleet_env("embedded", request, tmp_path), logs), "embedded", tiny_model)
    try:
        frontend = fleet.start_frontend("--keep-models", "--zero-wait-s", str(int(ENGINE_START_TIMEOUT)))

        # A worker registers the model and answers once, then leaves: the model stays listed.
        first = fleet.start_worker(name="vllm-first")
        fleet.wait_serving(first)
        expected = complete(frontend.port, 60)["choices"][0]["text"]
        first.send_signal(signal.SIGTERM)
        assert await first.wait_exit(60) == 0, first.describe()
        fleet.workers.remove(first)
        assert frontend.models() == [MODEL], "a kept model stays listed with no worker"

        planner = Planner(fleet.pool, planner_config(tmp_path / "planner.yaml", fleet, frontend.port))
        fleet_of, describe = planner.fleet, planner.describe
        await wait_until(lambda: planner.health().get("signals", {}).get("frontend_metrics", {}).get("state")
                         == "ok", 60, describe, interval=0.2, ignore=(OSError, ValueError))
        assert fleet_of() == {"ready": 0, "pending": 0}, describe()

        # At zero, a stream waits; the planner starts a vLLM worker, and the stream is
        # served by it: the same tokens the first worker gave, first.
        max_tokens = 600
        body = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        start = time.monotonic()
        stream = StreamInFlight(frontend.port, body, ENGINE_START_TIMEOUT + 60)
        assert await asyncio.to_thread(stream.started.wait, ENGINE_START_TIMEOUT + 30), describe()
        waited = time.monotonic() - start
        assert "demand at zero replicas: start one" in planner.process.describe(), describe()
        assert fleet_of()["ready"] + fleet_of()["pending"] == 1, describe()
        assert waited > 2.0, waited  # a real start: vLLM loads the model, then registers

        # The planner stops with the stream in flight on its worker: it drains the worker
        # (SIGTERM to the worker alone: vLLM's engine core given it too would abort the
        # stream), the stream ends whole, the planner exits 0 and no engine process is left
        # (the module's fixture checks that).
        planner.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(stream.wait_end, 180)
        assert stream.status == 200, (stream.status, stream.body[-500:])
        chunks = whole_completion_stream(stream.body, max_tokens)
        text = "".join(c["choices"][0]["text"] for c in chunks if c.get("choices"))
        assert text.startswith(expected), (text[:200], expected)
        assert await planner.process.wait_exit(90) == 0, planner.process.describe()
        assert "draining agg[1]" in planner.process.describe(), planner.process.describe()
    finally:
        stop_all(fleet.pool)

"""Readiness and drain of the LLM path in real processes (docs/reliability.md,
"Readiness and drain"): a mocker worker (`dynamo-run in=dyn://… out=mocker`) answers
`/ready` on its system port only once its model is registered and its engine answered,
and 503 from the moment SIGTERM starts its drain while its in-flight stream finishes;
the HTTP frontend answers `/ready` 503 until it can route a model, and once SIGTERM
starts its drain it no longer says ready while its in-flight stream finishes; each
process then exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest
from helpers import WorkerPool, free_port, wait_until
from llm_helpers import (
    MOCKER,
    Frontend,
    chat_body,
    http_request,
    post_json,
    start_frontend,
    streamed_content,
    write_json,
)

pytestmark = pytest.mark.timeout(120)

#: Tokens of the in-flight request; with `SLOW_MOCKER` it streams for a few seconds.
MAX_TOKENS = 40
SLOW_MOCKER = {"speedup_ratio": 0.05}
SHUTDOWN_TIMEOUT = "20"


def ready(port: int) -> tuple[int, str]:
    """`GET /ready` on `port`: the status and the body's `status` word."""
    response = http_request(port, "GET", "/ready", timeout=2)
    return response.status, json.loads(response.body).get("status", "")


def start_worker(workers: WorkerPool, env: dict[str, str], model_dir: Path, endpoint: str, settings: Path) -> tuple:
    port = free_port()
    argv = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint, "--extra-engine-args", str(settings)]
    worker = workers.command(argv, name="mocker", env={
        **env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port),
        "DYN_SHUTDOWN_TIMEOUT": SHUTDOWN_TIMEOUT,
    })
    return worker, port


def inflight(frontend: Frontend) -> float:
    text = frontend.get("/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynamo_frontend_inflight_requests"))


async def stream_in_flight(frontend: Frontend, model: str) -> asyncio.Task:
    """A streaming chat request through `frontend`, returned once the frontend serves it."""
    body = chat_body(model, "tell me a long story", max_tokens=MAX_TOKENS, stream=True,
                     stream_options={"include_usage": True})
    task = asyncio.ensure_future(asyncio.to_thread(post_json, frontend.port, "/v1/chat/completions", body, 60))
    await wait_until(lambda: task.done() or inflight(frontend) >= 1, 10, "the request to be in flight")
    assert not task.done(), task.result()
    return task


def assert_complete(response) -> None:
    assert response.status == 200, response.body[:500]
    _, chunks = streamed_content(response.body)  # fails without [DONE]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == MAX_TOKENS, usage


async def test_ready_and_drain_of_worker_and_frontend(workers, backend, namespace, model_dir, tmp_path):
    settings = write_json(tmp_path / "mocker.json", SLOW_MOCKER)
    model = model_dir.name
    endpoint = f"{namespace}.mocker.generate"
    frontend = await start_frontend(workers, "dyn", env=backend.with_(DYN_SHUTDOWN_TIMEOUT=SHUTDOWN_TIMEOUT))
    assert ready(frontend.port) == (503, "not_ready"), "no model can be routed yet"

    # A worker: ready once it registered its model and its engine answered.
    worker, worker_port = start_worker(workers, backend, model_dir, endpoint, settings)
    await worker.wait_for_line("dynamo-run: serving model", 30)
    assert ready(worker_port) == (200, "ready")
    await frontend.wait_models([model])
    assert ready(frontend.port) == (200, "ready")

    # SIGTERM the worker mid-stream: 503 draining at once, the stream finishes, exit 0.
    streaming = await stream_in_flight(frontend, model)
    worker.send_signal(signal.SIGTERM)
    await wait_until(lambda: ready(worker_port) == (503, "draining"), 5, "the worker's /ready to say draining",
                     ignore=(OSError, ValueError))
    assert not streaming.done(), "the drain was seen while the stream was still in flight"
    assert_complete(await streaming)
    assert await worker.wait_exit(int(SHUTDOWN_TIMEOUT) + 10) == 0, worker.describe()
    await wait_until(lambda: ready(frontend.port)[0] == 503, 15, "the frontend's /ready to drop with its last worker")

    # A second worker, then SIGTERM the frontend mid-stream: it never says ready again,
    # the stream finishes, exit 0.
    worker, worker_port = start_worker(workers, backend, model_dir, endpoint, settings)
    await worker.wait_for_line("dynamo-run: serving model", 30)
    await frontend.wait_models([model])
    streaming = await stream_in_flight(frontend, model)
    frontend.process.send_signal(signal.SIGTERM)

    def not_ready() -> bool:
        try:
            return ready(frontend.port) == (503, "draining")
        except OSError:
            return True  # it no longer accepts connections: a probe fails, which counts as not ready

    await wait_until(not_ready, 5, "the frontend's /ready to stop saying ready")
    assert not streaming.done(), "the drain began while the stream was still in flight"
    assert_complete(await streaming)
    assert await frontend.process.wait_exit(int(SHUTDOWN_TIMEOUT) + 10) == 0, frontend.process.describe()
    assert ready(worker_port) == (200, "ready"), "the worker is not affected"

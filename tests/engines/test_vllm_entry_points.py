"""The other ways to start a real vLLM worker: ``dynamo-run in=http out=vllm`` (the engine
as the frontend's child process) and the ``examples/llm`` graph with ``engine: vllm``
under ``dynamo serve`` (``configs/agg_vllm_cpu.yaml``), each serving the tiny model.
A killed engine under ``dynamo-run`` (its only worker: no other to continue on) ends the stream with an error,
never as if it had finished, and the run stops naming its child. SIGTERM to ``dynamo serve``
with a stream in flight lets the stream end whole (the vLLM worker drains before it stops
its engine).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_fleet import (
    ENGINE_FLAGS,
    MODEL,
    StreamInFlight,
    engine_core_of,
    engine_env,
    fleet_env,
    models_of,
    stop_all,
    wait_http,
    whole_completion_stream,
)
from helpers import EXAMPLES_DIR, WorkerPool, WorkerProcess, free_port, wait_until_blocking
from llm_helpers import DYNAMO_RUN, local_env, post_json, sse_data

pytestmark = pytest.mark.timeout(240)


class Served:
    def __init__(self, process: WorkerProcess, port: int):
        self.process = process
        self.port = port


@pytest.fixture(scope="module")
def dynamo_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("dynamo-run")
    pool = WorkerPool(engine_env(local_env(DYN_FILE_KV=str(root / "kv"))), root)
    port = free_port()
    argv = [
        *DYNAMO_RUN, "in=http", "out=vllm", "--model-path", str(tiny_model), "--model-name", MODEL,
        "--http-port", str(port), "--", *ENGINE_FLAGS,
    ]
    try:  # also when the start fails: no engine outlives the module
        process = pool.command(argv, name="dynamo-run-vllm")
        wait_http(process, port, "/v1/models", lambda r: models_of(r) == [MODEL])
        yield Served(process, port)
    finally:
        stop_all(pool)


def chat(port: int, **extra: Any) -> Any:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, **extra}
    return post_json(port, "/v1/chat/completions", body, timeout=60)


def test_dynamo_run_out_vllm_serves_the_model(dynamo_run: Served) -> None:
    whole = chat(dynamo_run.port, temperature=0)
    assert whole.status == 200, whole.body
    answer = whole.json()
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 8 and answer["choices"][0]["message"]["content"]
    streamed = chat(dynamo_run.port, temperature=0, stream=True)
    payloads = sse_data(streamed.body)
    assert payloads[-1] == "[DONE]"
    text = "".join(
        (json.loads(p)["choices"][0]["delta"].get("content") or "") for p in payloads[:-1] if json.loads(p)["choices"]
    )
    assert text == answer["choices"][0]["message"]["content"]


def test_a_killed_engine_ends_the_stream_with_an_error_and_the_run_stops(dynamo_run: Served) -> None:
    result: dict[str, Any] = {}

    def stream() -> None:
        resp = chat(dynamo_run.port, temperature=0, stream=True, max_tokens=900)
        result["status"], result["body"] = resp.status, resp.body

    client = threading.Thread(target=stream)
    client.start()
    # The engine is a grandchild: dynamo-run -> python -m dynamo.vllm -> VLLM::EngineCore.
    engine = engine_core_of(dynamo_run.process)
    time.sleep(0.5)  # the stream is under way
    os.kill(engine, signal.SIGKILL)
    client.join(60)
    assert not client.is_alive()
    payloads = sse_data(result["body"])
    # Never a normal end: no [DONE], an error event last.
    assert payloads[-1] != "[DONE]", payloads[-3:]
    assert "error" in json.loads(payloads[-1]), payloads[-1]
    # The worker shut down, and with it the run, naming its child's exit.
    wait_until_blocking(lambda: dynamo_run.process.proc.poll() is not None, 60,
                        lambda: f"dynamo-run to exit\n{dynamo_run.process.describe()}", interval=0.2)
    assert dynamo_run.process.proc.returncode != 0, dynamo_run.process.describe()
    assert "python -m dynamo.vllm" in dynamo_run.process.stderr_tail(), dynamo_run.process.stderr_tail()


@pytest.fixture(scope="module")
def graph(
    tiny_model: Path, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("graph")
    pool = WorkerPool(engine_env(fleet_env("embedded", request, root)), root)
    port = free_port()
    namespace = f"graph{os.getpid()}"
    argv = [
        sys.executable, "-m", "dynamo.sdk.cli.main", "serve", "graphs.agg:Frontend", "-f", "configs/agg_vllm_cpu.yaml",
        f"--Frontend.port={port}", f"--Common.model-path={tiny_model}", f"--Common.model-name={MODEL}",
        *[f"--{s}.ServiceArgs.dynamo.namespace={namespace}" for s in ("Frontend", "Processor", "Worker")],
    ]
    try:  # also when the start fails: no engine outlives the module
        process = pool.command(argv, name="serve-agg-vllm", cwd=EXAMPLES_DIR / "llm")
        wait_http(process, port, "/v1/models", lambda r: models_of(r) == [MODEL])
        yield Served(process, port)
    finally:
        stop_all(pool)


def test_the_llm_graph_serves_the_model_with_engine_vllm(graph: Served) -> None:
    for stream in (False, True):
        resp = chat(graph.port, temperature=0, stream=stream)
        assert resp.status == 200, resp.body
        if stream:
            assert sse_data(resp.body)[-1] == "[DONE]"
        else:
            assert resp.json()["choices"][0]["finish_reason"] == "length"


def test_sigterm_to_dynamo_serve_lets_the_stream_in_flight_end_whole(graph: Served) -> None:
    """Last in the module: it stops the graph. `dynamo serve` forwards SIGTERM to the
    vLLM worker's own process (not its process group): the worker drains, the stream in
    flight ends whole, the worker stops its engine, and `dynamo serve` exits 0. With the
    SIGTERM sent to the group (before `6739bad`), vLLM's engine core aborted the stream,
    which ended with an error event ("the vLLM engine died")."""
    max_tokens = 600
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    stream = StreamInFlight(graph.port, body, 120)
    assert stream.started.wait(60) and stream.status == 200, (stream.status, stream.body[-500:])
    graph.process.send_signal(signal.SIGTERM)
    stream.wait_end(120)
    whole_completion_stream(stream.body, max_tokens)
    wait_until_blocking(lambda: graph.process.proc.poll() is not None, 120,
                        lambda: f"dynamo serve to exit\n{graph.process.describe()}", interval=0.2)
    assert graph.process.proc.returncode == 0, graph.process.describe()

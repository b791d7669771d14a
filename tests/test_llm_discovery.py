"""A frontend (`dynamo-run in=http out=dyn`) following workers in other processes, on both
backends: mocker workers and the Python worker example coming and going, two models at
once, `/health`, 503 for a model with no instance, a client disconnect stopping the
mocker's request, and `register_llm`'s errors."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import EXAMPLES_DIR, WorkerPool, alive, started_pids, wait_for_instances, wait_until
from llm_helpers import (
    DYNAMO_RUN,
    HTTP_TIMEOUT,
    Frontend,
    chat_body,
    first_load_report,
    start_frontend,
    start_mocker,
    streamed_content,
    write_json,
)

pytestmark = pytest.mark.timeout(150)



@pytest.fixture
def fast_mocker_args(tmp_path: Path) -> Path:
    """Mocker settings that make a short request take a few milliseconds."""
    return write_json(tmp_path / "fast.json", {"speedup_ratio": 20.0})


def client(frontend: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)


async def test_models_follow_workers(
    workers: WorkerPool, namespace: str, model_dir: Path, fast_mocker_args: Path
) -> None:
    frontend = await start_frontend(workers, "dyn")
    assert frontend.models() == []
    assert frontend.get("/health").status == 503

    alpha = start_mocker(
        workers, f"{namespace}.alpha.generate", model_dir, "--model-name", "alpha",
        "--extra-engine-args", str(fast_mocker_args), name="alpha",
    )
    await frontend.wait_models(["alpha"])
    health = await frontend.wait_status("/health", 200)
    assert health.json()["models"] == ["alpha"]

    # A second model from dynamo-run itself (the Rust worker path).
    beta = workers.command(
        [*DYNAMO_RUN, f"in=dyn://{namespace}.beta.generate", "out=mocker", "--model-path", str(model_dir),
         "--model-name", "beta", "--extra-engine-args", str(fast_mocker_args)],
        name="beta",
    )
    await frontend.wait_models(["alpha", "beta"])

    c = client(frontend)
    for model in ("alpha", "beta"):
        response = await asyncio.to_thread(
            c.chat.completions.create, model=model, messages=[{"role": "user", "content": "w5 w6 w7"}], max_tokens=6
        )
        assert response.model == model
        assert response.choices[0].finish_reason == "length"
        assert response.usage is not None and response.usage.completion_tokens == 6
        assert response.choices[0].message.content

    alpha.terminate()
    await frontend.wait_models(["beta"])
    beta.terminate()
    await frontend.wait_models([])
    await frontend.wait_status("/health", 503)
    gone = frontend.post("/v1/chat/completions", chat_body("alpha", "x"))
    assert gone.status in (404, 503), gone


async def test_openai_client_streams_from_mocker(
    workers: WorkerPool, namespace: str, model_dir: Path, fast_mocker_args: Path
) -> None:
    start_mocker(workers, f"{namespace}.mocker.generate", model_dir, "--extra-engine-args", str(fast_mocker_args))
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models([model_dir.name])
    c = openai.AsyncOpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)
    try:
        stream = await c.chat.completions.create(
            model=model_dir.name, messages=[{"role": "user", "content": "w10 w11"}], max_tokens=12,
            stream=True, stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        completion = await c.completions.create(model=model_dir.name, prompt="w3 w4", max_tokens=5)
    finally:
        await c.close()
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices).strip()
    assert completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 5


@pytest.mark.parametrize("router_mode", ["round-robin", "kv"])
async def test_mocker_num_workers(
    runtime: Any, workers: WorkerPool, namespace: str, model_dir: Path, fast_mocker_args: Path, router_mode: str
) -> None:
    supervisor = start_mocker(
        workers, f"{namespace}.mocker.generate", model_dir, "--num-workers", "2",
        "--extra-engine-args", str(fast_mocker_args),
    )
    endpoint_client = await runtime.namespace(namespace).component("mocker").endpoint("generate").client()
    ids = await wait_for_instances(endpoint_client, 2)
    assert len(set(ids)) == 2
    frontend = await start_frontend(workers, "dyn", "--router-mode", router_mode)
    await frontend.wait_models([model_dir.name])
    for _ in range(4):
        response = frontend.post("/v1/chat/completions", chat_body(model_dir.name, "w9", max_tokens=2))
        assert response.status == 200, response

    # Each worker runs under dynamo.supervisor: its own process group, in the launcher's session.
    pids = started_pids(supervisor, "mocker")
    assert sorted(pids) == ["mocker[0]", "mocker[1]"], supervisor.describe()
    assert {label: (os.getpgid(pid) == pid, os.getsid(pid)) for label, pid in pids.items()} == {
        label: (True, os.getsid(supervisor.pid)) for label in pids
    }

    # SIGTERM to the launcher stops every worker: each exits (reaped by the launcher,
    # which exits 0) and deregisters.
    supervisor.send_signal(signal.SIGTERM)
    assert await supervisor.wait_exit(45) == 0, supervisor.describe()
    assert [label for label, pid in pids.items() if alive(pid)] == [], supervisor.describe()
    await wait_until(
        lambda: endpoint_client.instance_ids() == [], 20,
        lambda: f"the workers to deregister (still {endpoint_client.instance_ids()})",
    )


async def test_model_without_instances_is_503(workers: WorkerPool, namespace: str) -> None:
    frontend = await start_frontend(workers, "dyn")
    orphan = await workers.start("llm_register_only.py", "--namespace", namespace)
    # The entry and its card are there, but nothing serves the endpoint: the model is not
    # routable, so it is not listed and the frontend is not healthy.
    body = chat_body("orphan", "hello")

    def answered() -> Any:
        response = frontend.post("/v1/chat/completions", body)
        return response if response.status != 404 else None

    response = await wait_until(
        answered, 20, lambda: f"the frontend to see the orphan's entry\n{orphan.describe()}", interval=0.1
    )
    assert response.status == 503, (response, orphan.describe())
    error = response.json()["error"]
    assert error["type"] == "service_unavailable" and error["message"]
    assert frontend.models() == []
    assert frontend.get("/health").status == 503


async def test_python_worker_example(workers: WorkerPool, namespace: str) -> None:
    worker = workers.command(
        [sys.executable, "-u", str(EXAMPLES_DIR / "llm" / "worker.py"), "--endpoint", f"{namespace}.echo_py.generate",
         "--model-name", "echo-py"],
        name="echo-py",
    )
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models(["echo-py"])
    await worker.wait_for_line("serving model 'echo-py'", 10)

    # The worker echoes the templated prompt of the built-in card, token by token.
    response = frontend.post("/v1/chat/completions", chat_body("echo-py", "hi there"))
    assert response.status == 200, response
    choice = response.json()["choices"][0]
    assert choice["message"]["content"] == "<|user|>\nhi there\n<|assistant|>\n"
    assert choice["finish_reason"] == "stop"

    streamed = frontend.post("/v1/chat/completions", chat_body("echo-py", "abc", max_tokens=5, stream=True))
    text, chunks = streamed_content(streamed.body)
    assert text == "<|use"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"

    stopped = frontend.post("/v1/completions", {"model": "echo-py", "prompt": "one two three", "stop": ["two"]})
    # Completions prompts reach the engine untemplated.
    assert stopped.json()["choices"][0]["text"] == "one "


async def test_disconnect_stops_mocker_request(
    runtime: Any, workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    # Slow: ~50 ms per token, so 5,000 tokens would run for minutes.
    slow = write_json(tmp_path / "slow.json", {"speedup_ratio": 0.1})
    start_mocker(workers, f"{namespace}.mocker.generate", model_dir, "--extra-engine-args", str(slow))
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models([model_dir.name])
    metrics = await runtime.namespace(namespace).component("mocker").subscribe("load_metrics")

    body = json.dumps(chat_body(model_dir.name, "w3 w4 w5", max_tokens=5000, stream=True)).encode()
    sock = socket.create_connection(("127.0.0.1", frontend.port), timeout=HTTP_TIMEOUT)
    try:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode() + body
        )
        received = b""
        while received.count(b"data: ") < 3:
            chunk = await asyncio.to_thread(sock.recv, 65536)
            assert chunk, f"the stream ended early: {received!r}"
            received += chunk
        busy = await first_load_report(
            metrics, lambda m: m["request_active_slots"] >= 1, 15, "load metrics showing the request running"
        )
        assert busy["kv_active_blocks"] >= 1
    finally:
        sock.close()
    idle = await first_load_report(
        metrics, lambda m: m["request_active_slots"] == 0 and m["kv_active_blocks"] == 0, 15,
        "load metrics showing the request gone after the client disconnected",
    )
    assert idle["num_requests_waiting"] == 0
    in_flight = [
        line for line in frontend.get("/metrics").body.decode().splitlines()
        if "inflight" in line and not line.startswith("#")
    ]
    assert all(line.rsplit(" ", 1)[1] in ("0", "0.0") for line in in_flight), in_flight


async def test_register_llm_errors(runtime: Any, namespace: str, tmp_path: Path) -> None:
    from dynamo.llm import ModelType, register_llm
    from dynamo.runtime import ConfigError

    endpoint = runtime.namespace(namespace).component("bad").endpoint("generate")
    with pytest.raises(ConfigError, match="no-such-dir"):
        await register_llm(endpoint, model_path=str(tmp_path / "no-such-dir"))
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ConfigError, match="tokenizer"):
        await register_llm(endpoint, model_path=str(empty))
    (empty / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError):
        await register_llm(endpoint, model_path=str(empty))
    with pytest.raises(ValueError, match="kind"):
        await register_llm(endpoint, kind="embedding")
    with pytest.raises(ConfigError, match="context length"):
        await register_llm(endpoint, context_length=0)
    with pytest.raises(ConfigError, match="kv_cache_block_size"):
        await register_llm(endpoint, kv_cache_block_size=0)
    assert await runtime.kv_store().kv_get_prefix(f"v1/models/{namespace}/") == []

    # A chat model needs no card; it registers with the kind and overrides given.
    await register_llm(endpoint, model_name="chatty", kind=ModelType.Chat, context_length=128)
    entries = await runtime.kv_store().kv_get_prefix(f"v1/models/{namespace}/")
    assert len(entries) == 1
    entry = json.loads(entries[0]["value"])
    assert (entry["name"], entry["kind"], entry["context_length"]) == ("chatty", "chat", 128)
    assert entry["instance_id"] == runtime.instance_id()

"""Every path around a real vLLM engine, on both backends: two ``python -m dynamo.vllm``
workers behind a frontend with ``--router-mode kv`` and ``--migration-limit 1``.

- vLLM's load metrics (running, waiting, KV usage) and its KV events (from its own ZMQ
  publisher) arrive; a prompt sharing a cached prefix goes to the worker that holds it,
  and the response reports the prefix hit (``usage.prompt_tokens_details.cached_tokens``);
- a client that disconnects aborts the vLLM request (its running count returns to 0);
- a prompt over ``max_model_len`` is a clear 400 and the worker serves on;
- the engine process killed mid-stream: the stream moves to the other worker and ends
  whole, the broken worker leaves discovery, the next requests go to the survivor.

The tests run in file order on one fleet per backend; the kill comes last.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_fleet import MODEL, Fleet, engine_core_of, fleet_env, stop_all, whole_completion_stream
from helpers import WorkerPool, WorkerProcess, wait_until
from llm_helpers import first_load_report, post_json, wait_for_metrics_from

pytestmark = pytest.mark.timeout(240)

#: Tokens per KV block (--block-size 32: vLLM's CPU attention takes multiples of 32).
BLOCK = 32
#: A prompt prefix of many blocks shared by the routing test's requests.
SHARED = " ".join(f"Paragraph {i} of the shared system prompt says the same thing again." for i in range(16))


@pytest.fixture(scope="module", params=["embedded", "etcd_nats"])
def fleet(request: pytest.FixtureRequest, tiny_model: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp(f"fleet-{request.param}")
    logs = root / "logs"
    logs.mkdir()
    fleet = Fleet(WorkerPool(fleet_env(request.param, request, root), logs), request.param, tiny_model)
    try:  # also when a start fails: no engine outlives the fleet
        fleet.start_frontend("--router-mode", "kv")
        workers = [fleet.start_worker("--migration-limit", "1") for _ in range(2)]
        fleet.wait_serving(*workers)
        yield fleet
    finally:
        stop_all(fleet.pool)


def instance_id(worker: WorkerProcess) -> int:
    """The worker's instance id, from its log (``serving endpoint=... instance=HEX``)."""
    log = re.sub(r"\x1b\[[0-9;]*m", "", worker.stderr_tail(1 << 20))
    found = re.search(r"serving endpoint=\S+\.generate instance=([0-9a-f]+)", log)
    assert found, f"no instance id in the log of {worker.name}\n{worker.describe()}"
    return int(found.group(1), 16)


@pytest.fixture
async def runtime(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Any]:
    """A runtime in this process on the fleet's backend, shut down after the test: its
    lease is given up while the fleet's etcd still answers, not left to the interpreter's
    exit."""
    from dynamo.runtime import DistributedRuntime

    for key in [k for k in os.environ if k.startswith("DYN_") or k in ("ETCD_ENDPOINTS", "NATS_SERVER")]:
        monkeypatch.delenv(key)
    for key, value in fleet.pool.env.items():
        if key.startswith("DYN_") or key in ("ETCD_ENDPOINTS", "NATS_SERVER"):
            monkeypatch.setenv(key, value)
    rt = DistributedRuntime(asyncio.get_running_loop(), False)
    yield rt
    await rt.shutdown()


async def metrics_of(fleet: Fleet, runtime: Any) -> Any:
    """The workers' load metrics subscription, once both have been heard."""
    component = runtime.namespace(fleet.namespace).component("backend")
    subscription = await component.subscribe("load_metrics")
    await wait_for_metrics_from(subscription, {instance_id(w) for w in fleet.workers}, timeout=30)
    return subscription


def complete(fleet: Fleet, prompt: str, max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    assert fleet.frontend is not None
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    resp = post_json(fleet.frontend.port, "/v1/completions", body, timeout=60)
    assert resp.status == 200, resp.body
    return resp.json()


def cached(resp: dict[str, Any]) -> int:
    return int(((resp.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0))


async def test_load_metrics_and_kv_events_send_a_shared_prefix_to_its_holder(
    fleet: Fleet, runtime: Any
) -> None:
    from dynamo.llm import KvIndexer
    from tokenizers import Tokenizer

    subscription = await metrics_of(fleet, runtime)
    report = await first_load_report(subscription, lambda r: r["kv_total_blocks"] > 0, 30, "a report with the KV size")
    assert report["request_total_slots"] == 64  # --max-num-seqs
    assert 0.0 <= report["gpu_cache_usage_perc"] <= 1.0

    indexer = KvIndexer(runtime.namespace(fleet.namespace).component("backend"), BLOCK)
    tokens = Tokenizer.from_file(str(fleet.model / "tokenizer.json")).encode(SHARED + " first").ids
    prefix_blocks = len(tokens) // BLOCK
    assert prefix_blocks >= 6
    first = complete(fleet, SHARED + " first")
    assert cached(first) == 0

    async def held() -> dict[int, int] | None:
        scores = (await indexer.find_matches_for_request(tokens)).scores
        return scores if scores and max(scores.values()) >= prefix_blocks - 1 else None

    # vLLM's events reached the event plane (and so the frontend's router).
    scores = await wait_until(held, 20, "the first prompt's blocks in the KV index")
    assert len(scores) == 1, scores
    holder = next(iter(scores))
    for i in range(4):
        again = complete(fleet, SHARED + f" question {i}")
        # Each went to the holder, whose vLLM found the prefix in its cache.
        assert cached(again) >= (prefix_blocks - 1) * BLOCK, (i, again["usage"])
    scores = (await indexer.find_matches_for_request(tokens)).scores
    assert set(scores) == {holder}, f"the prefix reached another worker: {scores}"


async def test_a_client_that_disconnects_aborts_the_vllm_request(fleet: Fleet, runtime: Any) -> None:
    assert fleet.frontend is not None
    subscription = await metrics_of(fleet, runtime)
    conn = http.client.HTTPConnection("127.0.0.1", fleet.frontend.port, timeout=30)
    body = {"model": MODEL, "prompt": "Tell a long story", "max_tokens": 1000, "temperature": 0, "stream": True}
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    lines = [resp.readline() for _ in range(4)]
    assert any(line.startswith(b"data: {") for line in lines), lines  # streaming
    running = await first_load_report(
        subscription, lambda r: r["request_active_slots"] >= 1, 30, "vLLM running the request"
    )
    conn.sock.shutdown(2) if conn.sock else None
    conn.close()
    # vLLM aborted it: the worker that ran it reports no request running or waiting.
    await first_load_report(
        subscription,
        lambda r: r["worker_id"] == running["worker_id"] and r["request_active_slots"] == 0
        and r["num_requests_waiting"] == 0,
        15,
        "vLLM's running count back to 0 after the client left",
    )


def test_a_prompt_over_max_model_len_is_a_400_and_the_worker_serves_on(fleet: Fleet) -> None:
    assert fleet.frontend is not None
    long_prompt = " ".join(f"word{i}" for i in range(1500))
    resp = post_json(fleet.frontend.port, "/v1/completions", {"model": MODEL, "prompt": long_prompt, "max_tokens": 4})
    assert resp.status == 400, resp.body
    assert "context length" in resp.json()["error"]["message"]
    assert complete(fleet, "Still there?")["choices"][0]["finish_reason"] == "length"


async def test_ready_only_once_vllm_answers_and_503_from_sigterm(
    fleet: Fleet, runtime: Any
) -> None:
    """A third worker with its system server: `/ready` is 503 while vLLM starts and until
    its model is registered and vLLM answered the readiness check, then 200; SIGTERM with
    a stream in flight on it turns `/ready` 503 `draining` at once, the stream finishes
    whole, and the worker exits 0. On the embedded backend only: what vLLM adds to the
    readiness contract does not depend on the backend, and its drain on etcd + NATS is
    checked with the mocker (`tests/test_ready_drain.py`); a third engine start per
    backend costs 33 s of the CI's budget."""
    if fleet.backend != "embedded":
        pytest.skip("vLLM's readiness is backend-independent: checked on the embedded backend (etcd + NATS drain: "
                    "tests/test_ready_drain.py)")
    from helpers import free_port

    port = free_port()
    worker = fleet.start_worker(name="vllm-ready", env={
        "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port),
    })
    seen: list[tuple[int, str]] = []

    def ready() -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/ready")
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read()).get("status", "")
        finally:
            conn.close()

    def became_ready() -> bool:
        if worker.proc.poll() is not None:
            pytest.fail(f"the worker exited\n{worker.describe()}")
        seen.append(ready())
        return seen[-1][0] == 200

    await wait_until(lambda: asyncio.to_thread(became_ready), 120, lambda: f"/ready 200 ({seen[-3:]})",
                     interval=0.2, ignore=(OSError,))
    assert seen[0][0] == 503 and seen[0][1] in ("not_registered", "engine_not_ready"), seen[:3]

    client = await runtime.namespace(fleet.namespace).component("backend").endpoint("generate").client()
    request = {"token_ids": [1, 10, 20], "stop_conditions": {"max_tokens": 600, "ignore_eos": True},
               "sampling_options": {"temperature": 0.0}, "eos_token_ids": []}
    stream = await client.direct(request, instance_id(worker), annotated=False)
    items = [await anext(stream)]
    worker.send_signal(signal.SIGTERM)

    async def draining() -> bool:
        return await asyncio.to_thread(ready) == (503, "draining")

    await wait_until(draining, 5, "/ready 503 draining", interval=0.05)
    items += [item async for item in stream]
    assert items[-1].get("finish_reason") == "length", items[-1]
    assert sum(len(i.get("token_ids") or []) for i in items) == 600
    assert await worker.wait_exit(60) == 0, worker.describe()
    fleet.workers.remove(worker)


async def test_a_killed_engine_moves_its_stream_and_its_worker_leaves(
    fleet: Fleet, runtime: Any
) -> None:
    assert fleet.frontend is not None
    subscription = await metrics_of(fleet, runtime)
    max_tokens = 900
    result: dict[str, Any] = {}

    def stream() -> None:
        body = {
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
        }
        assert fleet.frontend is not None
        resp = post_json(fleet.frontend.port, "/v1/completions", body, timeout=120)
        result["status"], result["body"] = resp.status, resp.body

    client = threading.Thread(target=stream)
    client.start()
    running = await first_load_report(
        subscription, lambda r: r["request_active_slots"] >= 1, 30, "vLLM running the stream"
    )
    victim = next(w for w in fleet.workers if instance_id(w) == running["worker_id"])
    survivor = next(w for w in fleet.workers if w is not victim)
    os.kill(engine_core_of(victim), signal.SIGKILL)
    await asyncio.to_thread(client.join, 120)
    assert not client.is_alive(), "the stream never ended"

    # The stream moved to the survivor and ended whole: every token, a real finish.
    assert result["status"] == 200, result
    whole_completion_stream(result["body"], max_tokens)

    # The broken worker shut down (it left discovery); new requests go to the survivor.
    await victim.wait_exit(60)
    for i in range(3):
        assert complete(fleet, f"After the crash {i}")["choices"][0]["finish_reason"] == "length"
    assert survivor.proc.poll() is None

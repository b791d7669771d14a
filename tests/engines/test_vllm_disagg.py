"""Disaggregated serving with vLLM for real, on the CPU: a ``--role prefill`` and a
``--role decode`` ``python -m dynamo.vllm`` worker behind our frontend, the prompt's KV
moved by vLLM's NixlConnector (NIXL over UCX, host memory: vLLM's CPU platform buffers
KV on ``cpu``), beside vLLM's own server on the same model as the aggregated reference.

- a long prompt is prefilled on the prefill worker (its ``done`` job and the decode
  worker's ``remote`` prefill, read from their system ``/metrics``) and the greedy
  answer (text, tokens, log probabilities, usage) is the aggregated server's;
- a short prompt stays on the decode worker (``local``), with the same answer;
- a streamed chat whose prompt is long goes remote too, and streams what vLLM streams.

The workers run the default connector's configuration with one change: a KV load that
fails fails the request (``kv_load_failure_policy: fail``; the default, ``recompute``,
would compute the prompt on the decode worker and hide it), so an answer here is one
decoded from the transferred KV.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_fleet import (
    MODEL,
    Fleet,
    fleet_env,
    launch_vllm_server,
    require,
    stop_all,
    wait_log,
    wait_vllm_server,
)
from helpers import WorkerPool, free_port
from llm_helpers import post_json, sse_data
from test_disagg import metric, wait_metric

#: The first test also waits for three engines to start (on 2 cores).
pytestmark = pytest.mark.timeout(480)

NIXL_MISSING = None if importlib.util.find_spec("nixl") else (
    "NIXL is not installed: scripts/install-vllm-cpu.sh installs nixl and nixl-cu13 (no CUDA needed; docs/vllm.md)"
)
#: The default connector (``NixlConnector``, ``kv_both``; ``kv_buffer_device`` is the
#: platform's, ``cpu`` here), a failed KV load failing the request instead of recomputing.
KV_TRANSFER = json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_load_failure_policy": "fail"})
#: Prompts longer than this (tokens) go to the prefill worker.
MAX_LOCAL = 64
LONG_PROMPT = " ".join(f"Item {i} of the inventory is a box of {i * 7} red marbles." for i in range(24))
SHORT_PROMPT = "The weather in Paris is"


@pytest.fixture(autouse=True)
def _needs_nixl() -> None:
    require(NIXL_MISSING, "the disaggregated engine test")


class Disagg:
    """Our frontend on a prefill + decode pair (``our_port``), vLLM's server
    (``vllm_port``), and the workers' system ports."""

    def __init__(self, our_port: int, vllm_port: int, prefill_port: int, decode_port: int):
        self.our_port = our_port
        self.vllm_port = vllm_port
        self.prefill_port = prefill_port
        self.decode_port = decode_port

    def both(self, path: str, body: dict[str, Any]) -> tuple[Any, Any]:
        """POST ``body`` to vLLM's server, then to ours; the decoded answers, vLLM's first."""
        answers = []
        for name, port in (("vllm", self.vllm_port), ("dynamo", self.our_port)):
            resp = post_json(port, path, body, timeout=120)
            assert resp.status == 200, f"{name}: {resp.status} {resp.body!r}"
            answers.append(sse_data(resp.body) if body.get("stream") else resp.json())
        return answers[0], answers[1]

    def prefills(self, source: str) -> float:
        return metric(self.decode_port, "dynamo_disagg_prefills_total", f'source="{source}"')

    def jobs(self, outcome: str) -> float:
        return metric(self.prefill_port, "dynamo_disagg_prefill_jobs_total", f'outcome="{outcome}"')


def system_env(port: int) -> dict[str, str]:
    return {"DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port)}


@pytest.fixture(scope="module")
def disagg(tiny_model: Path, module_pool: WorkerPool, request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Disagg]:
    require(NIXL_MISSING, "the disaggregated engine test")  # before its engines start
    env = fleet_env("embedded", request, tmp_path_factory.mktemp("disagg"))
    fleet = Fleet(WorkerPool(env, module_pool.log_dir), "embedded", tiny_model)
    try:
        # vLLM's server starts first, alone: once a NixlConnector worker is up, a thread of
        # NIXL's UCX backend (nixlUcxSharedThread, re-arming the UCX worker in a loop) keeps
        # a core busy, idle or not (vllm-cpu 0.32, NIXL 1.5.1); a server started after the
        # two workers shared 2 cores with two busy threads (docs/vllm.md).
        server, vllm_port = launch_vllm_server(module_pool, tiny_model)
        wait_vllm_server(server, vllm_port)
        frontend = fleet.start_frontend()
        prefill_port, decode_port = free_port(), free_port()
        prefill = fleet.start_worker(
            "--role", "prefill", "--endpoint", f"dyn://{fleet.namespace}.prefill.generate",
            "--kv-transfer-config", KV_TRANSFER, name="vllm-prefill", env=system_env(prefill_port),
        )
        decode = fleet.start_worker(
            "--role", "decode", "--max-local-prefill-length", str(MAX_LOCAL), "--remote-prefill-timeout", "60",
            "--kv-transfer-config", KV_TRANSFER, name="vllm-decode", env=system_env(decode_port),
        )
        wait_log(prefill, f"{fleet.namespace}.prefill.generate")  # "serving endpoint=NS.prefill.generate"
        fleet.wait_serving(decode)
        yield Disagg(frontend.port, vllm_port, prefill_port, decode_port)
    finally:
        # Also when a start failed: no engine outlives the module.
        stop_all(fleet.pool)


def completion_view(resp: dict[str, Any]) -> list[dict[str, Any]]:
    """Per choice: text, finish reason, the listed tokens and their log probabilities
    (rounded: the two servers batch and split the prompt differently)."""
    return [
        {
            "text": c["text"],
            "finish_reason": c["finish_reason"],
            "tokens": (c.get("logprobs") or {}).get("tokens"),
            "token_logprobs": [round(x, 2) for x in (c.get("logprobs") or {}).get("token_logprobs") or []],
        }
        for c in resp["choices"]
    ]


def usage(resp: dict[str, Any]) -> tuple[int, int]:
    return resp["usage"]["prompt_tokens"], resp["usage"]["completion_tokens"]


async def test_a_long_prompt_is_prefilled_remotely_and_answers_as_aggregated_vllm(disagg: Disagg) -> None:
    remote, done = disagg.prefills("remote"), disagg.jobs("done")
    body = {"model": MODEL, "prompt": LONG_PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 2}
    theirs, ours = await asyncio.to_thread(disagg.both, "/v1/completions", body)
    assert usage(ours)[0] > MAX_LOCAL, usage(ours)
    assert completion_view(ours) == completion_view(theirs)
    assert usage(ours) == usage(theirs)
    assert ours["choices"][0]["finish_reason"] == "length" and ours["choices"][0]["text"]
    await wait_metric(disagg.prefill_port, "dynamo_disagg_prefill_jobs_total", 'outcome="done"', done + 1, timeout=30)
    assert disagg.prefills("remote") == remote + 1
    assert disagg.prefills("fallback") == 0
    assert disagg.jobs("failed") == 0 and disagg.jobs("expired") == 0


async def test_a_short_prompt_is_prefilled_locally_with_the_same_answer(disagg: Disagg) -> None:
    local, done = disagg.prefills("local"), disagg.jobs("done")
    body = {"model": MODEL, "prompt": SHORT_PROMPT, "max_tokens": 16, "temperature": 0, "logprobs": 1}
    theirs, ours = await asyncio.to_thread(disagg.both, "/v1/completions", body)
    assert completion_view(ours) == completion_view(theirs)
    assert disagg.prefills("local") == local + 1
    assert disagg.jobs("done") == done


async def test_a_streamed_chat_with_a_long_prompt_goes_remote_and_streams_as_vllm(disagg: Disagg) -> None:
    remote = disagg.prefills("remote")
    messages = [{"role": "user", "content": "Count the marbles. " + LONG_PROMPT[::-1]}]
    body = {"model": MODEL, "messages": messages, "max_tokens": 20, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    theirs, ours = await asyncio.to_thread(disagg.both, "/v1/chat/completions", body)

    def content(payloads: list[str]) -> tuple[str, Any, Any]:
        assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
        chunks = [json.loads(p) for p in payloads[:-1]]
        text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c["choices"])
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
        last_usage = [c["usage"] for c in chunks if c.get("usage")][-1]
        return text, finish, (last_usage["prompt_tokens"], last_usage["completion_tokens"])

    assert content(ours) == content(theirs)
    assert content(ours)[2][0] > MAX_LOCAL
    assert disagg.prefills("remote") == remote + 1

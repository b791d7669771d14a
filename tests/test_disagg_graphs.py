"""The disaggregated graphs of examples/llm under `dynamo serve`: `disagg` (Frontend →
Processor → Worker → PrefillWorker, on both backends) and `disagg_router` (… → Router →
Worker → PrefillWorker), mocker engines. The official `openai` client streams through
each; long prompts are prefilled on the PrefillWorker and short ones on the Worker,
counted from the Worker's `/metrics`."""

from __future__ import annotations

import asyncio
import sys

import pytest
from helpers import free_port, wait_for_instances
from llm_helpers import http_request
from test_llm_graphs import LLM, openai_client, stream_chat, wait_model

SERVICES = {
    "disagg": ("Frontend", "Processor", "Worker", "PrefillWorker"),
    "disagg_router": ("Frontend", "Processor", "Router", "Worker", "PrefillWorker"),
}

pytestmark = pytest.mark.timeout(180)


def serve(workers, graph: str, namespace: str, port: int, worker_metrics_port: int):
    argv = [
        sys.executable, "-m", "dynamo.sdk.cli.main", "serve", f"graphs.{graph}:Frontend", "-f",
        f"configs/{graph}.yaml", f"--Frontend.port={port}",
        *[f"--{s}.ServiceArgs.dynamo.namespace={namespace}" for s in SERVICES[graph]],
        "--Worker.ServiceArgs.envs.DYN_SYSTEM_ENABLED=true", "--Worker.ServiceArgs.envs.DYN_SYSTEM_HOST=127.0.0.1",
        f"--Worker.ServiceArgs.envs.DYN_SYSTEM_PORT={worker_metrics_port}",
    ]
    return workers.command(argv, name=f"serve-{graph}", cwd=LLM)


def prefills(port: int) -> dict[str, float]:
    response = http_request(port, "GET", "/metrics")
    assert response.status == 200, response
    counts = {"remote": 0.0, "local": 0.0, "fallback": 0.0}
    for line in response.body.decode().splitlines():
        if line.startswith("dynamo_disagg_prefills_total{"):
            counts[line.split('source="', 1)[1].split('"', 1)[0]] += float(line.rsplit(" ", 1)[1])
    return counts


async def check_disagg(runtime, namespace: str, port: int, metrics_port: int) -> None:
    await wait_for_instances(await runtime.endpoint(f"{namespace}.PrefillWorker.generate").client(), 1)
    await wait_for_instances(await runtime.endpoint(f"{namespace}.Worker.generate").client(), 1)
    client = openai_client(port)
    await wait_model(client, "mock-llm")
    # The configs' threshold is 64 tokens (byte-level card: about a token a byte).
    chunks, finish = await asyncio.wait_for(stream_chat(client, "hi", max_tokens=6), 30)
    assert finish == "length" and chunks >= 1
    before = prefills(metrics_port)
    assert before["local"] >= 1 and before["remote"] == 0, before
    long_prompts = [f"prompt {i}: " + "a rather long prompt that the prefill worker computes " * 4 for i in range(3)]
    results = await asyncio.wait_for(
        asyncio.gather(*(stream_chat(client, text, max_tokens=8) for text in long_prompts)), 30
    )
    for chunks, finish in results:
        assert finish == "length" and chunks >= 1, results
    after = prefills(metrics_port)
    assert after["remote"] >= 1 and after["fallback"] == 0, after
    assert after["remote"] + after["local"] - before["local"] == 3, after


async def test_disagg_graph(backend, workers, runtime, namespace) -> None:
    port, metrics_port = free_port(), free_port()
    served = serve(workers, "disagg", namespace, port, metrics_port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    await check_disagg(runtime, namespace, port, metrics_port)


async def test_disagg_router_graph(workers, runtime, namespace) -> None:
    port, metrics_port = free_port(), free_port()
    served = serve(workers, "disagg_router", namespace, port, metrics_port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    await check_disagg(runtime, namespace, port, metrics_port)


async def test_prefill_worker_alone_joins_the_graph(workers, runtime, namespace) -> None:
    port, metrics_port = free_port(), free_port()
    served = serve(workers, "disagg", namespace, port, metrics_port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    prefill = await runtime.endpoint(f"{namespace}.PrefillWorker.generate").client()
    assert len(await wait_for_instances(prefill, 1)) == 1
    argv = [sys.executable, "-m", "components.prefill_worker", "-f", "configs/disagg.yaml",
            f"--PrefillWorker.ServiceArgs.dynamo.namespace={namespace}"]
    workers.command(argv, name="prefill-alone", cwd=LLM)
    assert len(await wait_for_instances(prefill, 2, timeout=60)) == 2
    await check_disagg(runtime, namespace, port, metrics_port)

"""The LLM graphs of examples/llm under `dynamo serve`, for real: `agg` (Frontend →
Processor → Worker, on both backends) and `agg_router` (… → Router → Worker, the Router's
KV policy following the workers' KV events) with mocker workers, the official `openai`
client streaming through each, and every component run alone with `python -m
components.<name>` joining a graph that `dynamo serve` started."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import openai
import pytest
from helpers import EXAMPLES_DIR, free_port, instance_counts_during, wait_for_instances, wait_until

LLM = EXAMPLES_DIR / "llm"
#: The services of each graph, and of each component run alone (what it depends on, unlinked).
GRAPHS = {"agg": ("Frontend", "Processor", "Worker"), "agg_router": ("Frontend", "Processor", "Router", "Worker")}
ALONE = {"Worker": ("Worker",), "Router": ("Router", "Worker"), "Processor": ("Processor", "Router", "Worker"),
         "Frontend": ("Frontend", "Processor", "Router", "Worker")}
#: Tokens per KV block in the graphs' configurations (`kv-cache-block-size`).
BLOCK_SIZE = 16
#: Bound on one streamed completion through the graph.
REQUEST_TIMEOUT = 30.0

pytestmark = pytest.mark.timeout(180)


def serve(workers, graph: str, config: str, namespace: str, port: int, *extra: str, env=None):
    """`dynamo serve graphs.<graph>:Frontend -f configs/<config>.yaml` in this test's namespace."""
    argv = [sys.executable, "-m", "dynamo.sdk.cli.main", "serve", f"graphs.{graph}:Frontend",
            "-f", f"configs/{config}.yaml", f"--Frontend.port={port}",
            *[f"--{s}.ServiceArgs.dynamo.namespace={namespace}" for s in GRAPHS[graph]], *extra]
    return workers.command(argv, name=f"serve-{graph}", cwd=LLM, env=env)


def component(workers, name: str, config: str, namespace: str, *extra: str):
    """`python -m components.<name> -f configs/<config>.yaml` alone, in this test's namespace."""
    argv = [sys.executable, "-m", f"components.{name.lower()}", "-f", f"configs/{config}.yaml",
            *[f"--{s}.ServiceArgs.dynamo.namespace={namespace}" for s in ALONE[name]], *extra]
    return workers.command(argv, name=f"{name.lower()}-alone", cwd=LLM)


def openai_client(port: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                              timeout=REQUEST_TIMEOUT)


async def wait_model(client: openai.AsyncOpenAI, model: str, timeout: float = 60.0) -> None:

    async def listed() -> bool:
        return model in [m.id async for m in client.models.list()]

    await wait_until(listed, timeout, f"model {model} to be listed", interval=0.2, ignore=(openai.APIConnectionError,))


async def stream_chat(client: openai.AsyncOpenAI, content: str, max_tokens: int = 8) -> tuple[int, str | None]:
    """Stream one chat completion; (content chunks, finish reason)."""
    stream = await client.chat.completions.create(
        model="mock-llm", messages=[{"role": "user", "content": content}], max_tokens=max_tokens, stream=True,
    )
    chunks, finish = 0, None
    async for chunk in stream:
        if chunk.choices:
            chunks += bool(chunk.choices[0].delta.content)
            finish = chunk.choices[0].finish_reason or finish
    return chunks, finish


async def check_streams(port: int) -> None:
    client = openai_client(port)
    await wait_model(client, "mock-llm")
    results = await asyncio.wait_for(
        asyncio.gather(*(stream_chat(client, f"hello number {i}") for i in range(6))), REQUEST_TIMEOUT
    )
    for chunks, finish in results:
        assert finish == "length" and chunks >= 1, results
    completion = await client.completions.create(model="mock-llm", prompt="once upon", max_tokens=5)
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="mock-llm", messages=[], max_tokens=0)


async def test_agg_graph(backend, workers, runtime, namespace) -> None:
    port = free_port()
    served = serve(workers, "agg", "agg", namespace, port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    # Two mocker workers (ServiceArgs.workers: 2), one Processor.
    assert len(await wait_for_instances(await runtime.endpoint(f"{namespace}.Worker.generate").client(), 2)) == 2
    await check_streams(port)


async def test_agg_graph_rolling_restart(backend, workers, runtime, namespace) -> None:
    """SIGHUP to `dynamo serve` of the agg graph: every process is replaced in turn, the
    mocker Workers (a `BaseDeployment` with endpoints) included, never both Workers at
    once; the graph streams afterwards."""
    import signal

    from helpers import started_pids

    port = free_port()
    served = serve(workers, "agg", "agg", namespace, port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    worker_client = await runtime.endpoint(f"{namespace}.Worker.generate").client()
    await wait_for_instances(worker_client, 2)
    await check_streams(port)
    before = started_pids(served, "dynamo serve")
    served.send_signal(signal.SIGHUP)
    seen = await instance_counts_during(
        worker_client, served.wait_for_line("[dynamo serve] rolling restart done", 120)
    )
    after = started_pids(served, "dynamo serve")
    assert {"Worker[0]", "Worker[1]"} <= set(after) and all(after[k] != before[k] for k in before), (before, after)
    assert min(seen) >= 1 and 1 in seen, sorted(set(seen))
    await check_streams(port)


RECORDING_POLICY = """
class Recording:
    def __init__(self, config):
        self.path = config["record-to"]

    def choose(self, token_ids, instance_ids):
        with open(self.path, "a") as f:
            f.write(f"{len(token_ids)}\\n")
        return min(instance_ids), 0.0
"""


async def test_agg_router_graph(workers, runtime, namespace, tmp_path: Path) -> None:
    """The Processor asks the Router for every request; the Router's policy is pluggable."""
    (tmp_path / "recording_policy.py").write_text(RECORDING_POLICY)
    record = tmp_path / "choices.txt"
    port = free_port()
    env = {**workers.env, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), workers.env.get("PYTHONPATH")) if p)}
    argv_extra = ("--Router.policy=recording_policy:Recording", f"--Router.record-to={record}")
    served = serve(workers, "agg_router", "agg_router", namespace, port, *argv_extra, env=env)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    router = await runtime.endpoint(f"{namespace}.Router.generate").client()
    await wait_for_instances(router, 1)
    worker_ids = await wait_for_instances(await runtime.endpoint(f"{namespace}.Worker.generate").client(), 2)
    await check_streams(port)
    # 6 chat requests and 1 completion went through the Router (the invalid one did not).
    assert len(record.read_text().splitlines()) == 7
    stream = await router.generate({"token_ids": list(range(40))})
    assert [item.data() async for item in stream] == [{"worker_id": min(worker_ids), "prefix_hit_rate": 0.0}]
    with pytest.raises(Exception, match="token_ids"):
        stream = await router.generate({"tokens": [1]})
        [item async for item in stream]


async def test_agg_router_graph_routes_by_kv_cache(workers, runtime, namespace) -> None:
    """The Router's default policy, the KV router, follows the Worker instances' KV events:
    a prompt goes to the instance that computed its prefix, whichever that is."""
    from dynamo.llm import KvIndexer

    port = free_port()
    served = serve(workers, "agg_router", "agg_router", namespace, port)
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    worker_client = await runtime.endpoint(f"{namespace}.Worker.generate").client()
    worker_ids = await wait_for_instances(worker_client, 2)
    router = await runtime.endpoint(f"{namespace}.Router.generate").client()
    await wait_for_instances(router, 1)
    await check_streams(port)

    workers_component = runtime.namespace(namespace).component("Worker")
    indexer = KvIndexer(workers_component, BLOCK_SIZE)
    for k, worker in enumerate(sorted(worker_ids)):
        prompt = [3 + (i * (k + 2)) % 250 for i in range(8 * BLOCK_SIZE)]  # 8 blocks, a first block of its own
        request = {"token_ids": prompt, "stop_conditions": {"max_tokens": 2}}
        items = [item async for item in await worker_client.direct(request, worker)]
        assert items, "the worker answered nothing"

        async def indexed(prompt: list[int] = prompt, worker: int = worker) -> bool:
            return (await indexer.find_matches_for_request(prompt)).scores == {worker: 8}

        await wait_until(indexed, 15, "the worker's KV events", interval=0.1)
        # The Router's own subscription gets the same events: probe it with the first two
        # blocks until it has them (a probe sent elsewhere meanwhile is counted there as
        # two predicted blocks, fewer than the eight the worker holds).
        probe = {"token_ids": prompt[: 2 * BLOCK_SIZE]}

        async def followed(probe: dict = probe, worker: int = worker) -> bool:
            answer = [item.data() async for item in await router.generate(probe)]
            return answer == [{"worker_id": worker, "prefix_hit_rate": 1.0}]

        await wait_until(followed, 15, "the Router to follow the KV events", interval=0.2)
        stream = await router.generate({"token_ids": [*prompt, 5, 6, 7]})
        assert [item.data() async for item in stream] == [{"worker_id": worker, "prefix_hit_rate": 1.0}]


def test_router_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(LLM))
    from components.router import load_policy
    from dynamo.sdk.lib.config import ServiceConfigError

    policy = load_policy("prefix-hash", {"kv-cache-block-size": 4})
    workers = [11, 22, 33]
    # The first block decides: the same first 4 tokens always go to the same worker.
    picks = {policy.choose([1, 2, 3, 4, *tail], workers)[0] for tail in ([], [9], [5, 6, 7, 8, 9])}
    assert len(picks) == 1
    # Distinct first blocks spread over the workers.
    spread = {policy.choose([i, i + 1, i + 2, i + 3], workers)[0] for i in range(60)}
    assert spread == set(workers)
    with pytest.raises(ServiceConfigError, match="policy"):
        load_policy("no-such-policy", {})
    with pytest.raises(ServiceConfigError, match="cannot be loaded"):
        load_policy("no_such_module:Policy", {})
    # The KV policy reads its settings at once (the router itself is made at start).
    kv = load_policy("kv", {"kv-cache-block-size": 32, "temperature": "0.5", "use-kv-events": "false"})
    assert (kv.block_size, kv.temperature, kv.use_kv_events) == (32, 0.5, False)
    with pytest.raises(ServiceConfigError, match="not a number"):
        load_policy("kv", {"overlap-weight": "heavy"})
    with pytest.raises(ServiceConfigError, match="use-kv-events"):
        load_policy("kv", {"use-kv-events": "sometimes"})


async def test_components_alone_join_the_graph(workers, runtime, namespace) -> None:
    port = free_port()
    served = serve(workers, "agg_router", "agg_router", namespace, port, "--Worker.ServiceArgs.workers=1")
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    for name in ("Worker", "Router", "Processor"):
        client = await runtime.endpoint(
            f"{namespace}.{name}.{'chat/completions' if name == 'Processor' else 'generate'}"
        ).client()
        assert len(await wait_for_instances(client, 1)) == 1
        component(workers, name, "agg_router", namespace)
        assert len(await wait_for_instances(client, 2, timeout=60)) == 2, name
    # A second Frontend, alone, on its own port, serves the same graph.
    second = free_port()
    component(workers, "Frontend", "agg_router", namespace, f"--Frontend.port={second}")
    await check_streams(second)
    await check_streams(port)


def test_worker_engine_flags_come_from_the_config(tmp_path: Path) -> None:
    """YAML keys → ServiceConfig.as_args → the engine's own parser (the mocker's)."""
    import subprocess

    bad = tmp_path / "bad.yaml"
    bad.write_text("Worker:\n  engine: mocker\n  no-such-flag: 3\n")
    result = subprocess.run([sys.executable, "-m", "components.worker", "-f", str(bad)], cwd=LLM,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--no-such-flag" in result.stderr, result.stderr
    if importlib.util.find_spec("vllm") is None:
        # engine: vllm reaches python -m dynamo.vllm, which says what is missing.
        result = subprocess.run([sys.executable, "-m", "components.worker", "--engine", "vllm"], cwd=LLM,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 2 and "needs the vllm package" in result.stderr, result.stderr


def test_engine_args_as_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(LLM))
    from components.worker import parse_args
    from dynamo.sdk.lib.config import ServiceConfig

    monkeypatch.delenv("DYNAMO_SERVICE_CONFIG", raising=False)
    try:
        engine, flags = parse_args(
            ["-f", str(LLM / "configs" / "agg.yaml"), "--speedup-ratio", "50", "--Worker.num-gpu-blocks=64"]
        )
    finally:
        ServiceConfig.reset()
    assert engine == "mocker"
    assert flags[flags.index("--speedup-ratio") + 1] == "50"
    assert flags[flags.index("--num-gpu-blocks") + 1] == "64"
    assert flags[flags.index("--model-name") + 1] == "mock-llm"
    assert "--engine" not in flags


async def test_processor_without_router_falls_back(workers, runtime, namespace) -> None:
    """A Processor in `kv` mode whose Router never answers still serves (bounded wait, then
    round-robin), and says so."""
    port = free_port()
    served = serve(workers, "agg", "agg", namespace, port, "--Worker.ServiceArgs.workers=1")
    await served.wait_for_line("Frontend[0] | Frontend ready", 90)
    processors = await runtime.endpoint(f"{namespace}.Processor.chat/completions").client()
    await wait_for_instances(processors, 1)
    alone = component(workers, "Processor", "agg", namespace, "--router=kv", "--router-timeout=1")
    await wait_for_instances(processors, 2, timeout=60)
    await check_streams(port)
    # The Frontend's client may see the second Processor later than this test does: send
    # on (bounded) until one request has reached it.
    client = openai_client(port)
    for i in range(30):
        if "no answer from the Router" in alone.stderr_tail(20000):
            break
        chunks, finish = await asyncio.wait_for(stream_chat(client, f"hello again {i}"), REQUEST_TIMEOUT)
        assert finish == "length" and chunks >= 1
    assert "no answer from the Router" in alone.stderr_tail(20000), alone.describe()


async def test_frontend_fails_when_its_http_server_does(workers, namespace) -> None:
    """The Frontend service exits non-zero when its HTTP frontend cannot start (port taken)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        frontend = component(workers, "Frontend", "agg", namespace, f"--port={port}", "--host=127.0.0.1")
        status = await frontend.wait_exit(60)
    assert status != 0, frontend.describe()
    assert "the HTTP frontend exited with status" in frontend.stderr_tail(20000), frontend.describe()

"""`dynamo serve` and standalone components, for real, on both backends: process counts,
requests through the graph, SIGTERM reaping every child after the shutdown hooks ran,
a crashing service, restarts, standalone runs, the link and proposal-002 examples."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import (
    EXAMPLES_DIR,
    READY_TIMEOUT,
    alive,
    free_port,
    instance_counts_during,
    request,
    started_pids,
    wait_for_instances,
)

GRAPHS = Path(__file__).parent / "sdk_graphs"
HELLO = EXAMPLES_DIR / "hello_world"
#: Bound on `dynamo serve` stopping after SIGTERM.
STOP_TIMEOUT = 30


def serve_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "dynamo.sdk.cli.main", "serve", *args]


def namespace_overrides(namespace: str, *services: str) -> list[str]:
    """Put every service of the graph in this test's namespace."""
    return [f"--{s}.ServiceArgs.dynamo.namespace={namespace}" for s in services]


def http_post(url: str, body: bytes, timeout: float = 20) -> str:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as response:
        return response.read().decode()


async def http_post_async(url: str, body: bytes) -> str:
    return await asyncio.to_thread(http_post, url, body)


@pytest.mark.timeout(120)
async def test_hello_world_graph(backend, workers, runtime, namespace):
    port = free_port()
    serve = workers.command(
        serve_argv(
            "hello_world:Frontend", "-f", "config.yaml", f"--Frontend.port={port}",
            *namespace_overrides(namespace, "Frontend", "Middle", "Backend"),
        ),
        name="serve", cwd=HELLO,
    )
    for label in ("Backend[0]", "Backend[1]", "Middle[0]", "Middle[1]"):
        await serve.wait_for_line(f"{label} | {label.split('[')[0]} ready", READY_TIMEOUT)
    await serve.wait_for_line("Frontend[0] | Frontend ready", READY_TIMEOUT)
    pids = started_pids(serve, "dynamo serve")
    assert sorted(pids) == ["Backend[0]", "Backend[1]", "Frontend[0]", "Middle[0]", "Middle[1]"], serve.describe()
    # Each child leads its own process group (stopped as one) but stays in the
    # supervisor's session: with Linux's autogroup, a session of its own would schedule
    # a frontend as a group apart from the engines' (100+ ms waits for a core).
    assert {label: (os.getpgid(pid) == pid, os.getsid(pid)) for label, pid in pids.items()} == {
        label: (True, os.getsid(serve.pid)) for label in pids
    }
    # The config's worker counts are what registered.
    backend_client = await runtime.endpoint(f"{namespace}.Backend.generate").client()
    assert len(await wait_for_instances(backend_client, 2)) == 2
    middle_client = await runtime.endpoint(f"{namespace}.Middle.generate").client()
    assert len(await wait_for_instances(middle_client, 2)) == 2

    body = await http_post_async(f"http://127.0.0.1:{port}/generate", b'{"text": "hello"}')
    assert body.splitlines() == ["Frontend: Middle: Backend: hello-earth-moon-mars"], body
    # Requests reach the Backend through the runtime too, round-robin over its 2 processes.
    items = await request(backend_client, {"text": "a b"})
    assert items == ["Backend: a", "Backend: b-mars"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
        assert health.status == 200
    # Malformed requests get a clear 422, the service keeps serving.
    with pytest.raises(urllib.error.HTTPError) as bad:
        await http_post_async(f"http://127.0.0.1:{port}/generate", b'{"txt": 1}')
    assert bad.value.code == 422 and b"text" in bad.value.read()

    serve.send_signal(signal.SIGTERM)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0, serve.describe()
    assert serve.find_lines("Frontend[0] | Frontend: shut down cleanly"), serve.describe()
    assert [label for label, pid in pids.items() if alive(pid)] == []


@pytest.mark.timeout(150)
async def test_rolling_restart_of_a_graph(backend, workers, runtime, namespace):
    """SIGHUP: every process of the graph is replaced in turn (stopped, restarted, its
    /ready awaited before the next), the Backend never has fewer than 1 of its 2
    instances registered, and the graph answers afterwards."""
    port = free_port()
    serve = workers.command(
        serve_argv(
            "hello_world:Frontend", "-f", "config.yaml", f"--Frontend.port={port}",
            *namespace_overrides(namespace, "Frontend", "Middle", "Backend"),
        ),
        name="serve", cwd=HELLO,
    )
    await serve.wait_for_line("Frontend[0] | Frontend ready", READY_TIMEOUT)
    backend_client = await runtime.endpoint(f"{namespace}.Backend.generate").client()
    await wait_for_instances(backend_client, 2)
    before = started_pids(serve, "dynamo serve")
    serve.send_signal(signal.SIGHUP)
    counts = await instance_counts_during(
        backend_client, serve.wait_for_line("[dynamo serve] rolling restart done", 120)
    )
    after = started_pids(serve, "dynamo serve")
    assert sorted(after) == sorted(before) and not set(after.values()) & set(before.values()), (before, after)
    assert min(counts) >= 1 and 1 in counts, f"Backend instances during the restart: {sorted(set(counts))}"
    assert [label for label, pid in before.items() if alive(pid)] == []
    body = await http_post_async(f"http://127.0.0.1:{port}/generate", b'{"text": "hello"}')
    assert body.splitlines() == ["Frontend: Middle: Backend: hello-earth-moon-mars"], body
    serve.send_signal(signal.SIGTERM)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0, serve.describe()


async def test_failing_service_stops_the_graph(backend, workers, namespace):
    serve = workers.command(
        serve_argv("broken:Frontend", *namespace_overrides(namespace, "Frontend", "Backend")),
        name="serve", cwd=GRAPHS, env={**backend, "DYN_SDK_STOP_TIMEOUT": "10"},
    )
    status = await serve.wait_exit(60)
    output = serve.stdout() + serve.stderr_tail()
    assert status != 0, output
    assert "boom: cannot load /nonexistent/model" in output
    assert re.search(r"Backend\[0\] exited with status 1", output), output
    assert "the graph failed" in output
    assert [pid for pid in started_pids(serve, "dynamo serve").values() if alive(pid)] == []


async def test_restart_on_failure(backend, workers, runtime, namespace, tmp_path):
    marker = tmp_path / "flaky-marker"
    serve = workers.command(
        serve_argv(
            "flaky:Flaky", f"--Flaky.marker={marker}", "--Flaky.ServiceArgs.restart=on-failure",
            *namespace_overrides(namespace, "Flaky"),
        ),
        name="serve", cwd=GRAPHS,
    )
    await serve.wait_for_line("Flaky[0] | Flaky ready", READY_TIMEOUT)
    output = serve.stdout()
    assert "Flaky[0] exited with status 3" in output and "restarting Flaky[0] (1/3)" in output, output
    client = await runtime.endpoint(f"{namespace}.Flaky.generate").client()
    await wait_for_instances(client, 1)
    (item,) = await request(client, "hi")
    assert item.startswith("hi from ")
    serve.send_signal(signal.SIGINT)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0, serve.describe()


async def test_standalone_components(backend, workers, runtime, namespace):
    """`python -m dynamo.sdk.run` and `python component.py` run one service each; together
    they form the graph without `dynamo serve`."""
    ns = f"--ServiceArgs.dynamo.namespace={namespace}"
    middle = workers.command(
        [sys.executable, "-m", "dynamo.sdk.run", "hello_world:Frontend", "--service-name", "Middle",
         "--message", "solo", ns, f"--Backend.ServiceArgs.dynamo.namespace={namespace}"],
        name="middle", cwd=HELLO,
    )
    backend_proc = workers.command(
        [sys.executable, "-m", "dynamo.sdk.run", "hello_world:Backend", "-f", "config.yaml", ns],
        name="backend", cwd=HELLO,
    )
    await middle.wait_for_line("Middle ready", READY_TIMEOUT)
    await backend_proc.wait_for_line("Backend ready", READY_TIMEOUT)
    client = await runtime.endpoint(f"{namespace}.Middle.generate").client()
    await wait_for_instances(client, 1)
    assert await request(client, {"text": "x"}) == ["Middle: Backend: x-solo-mars"]


async def test_proposal_component_under_serve_and_alone(backend, workers, runtime, namespace):
    example = EXAMPLES_DIR / "standalone"
    ns = f"--Worker.ServiceArgs.dynamo.namespace={namespace}"
    serve = workers.command(
        serve_argv("greeter:Greeter", "-f", "config.yaml", ns, f"--Greeter.ServiceArgs.dynamo.namespace={namespace}"),
        name="serve", cwd=example,
    )
    await serve.wait_for_line("Greeter[0] | Greeter ready", READY_TIMEOUT)
    await serve.wait_for_line("Worker[1] | Worker ready", READY_TIMEOUT)
    client = await runtime.endpoint(f"{namespace}.Greeter.generate").client()
    await wait_for_instances(client, 1)
    assert await request(client, "you") == ["bonjour you :)", "bonjour you :)"]
    workers_client = await runtime.endpoint(f"{namespace}.Worker.generate").client()
    assert len(await wait_for_instances(workers_client, 2)) == 2
    serve.send_signal(signal.SIGTERM)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0, serve.describe()

    # The same component alone, configured by flags.
    alone = workers.command(
        [sys.executable, "worker.py", "--suffix", "?", "--repeat", "1", f"--ServiceArgs.dynamo.namespace={namespace}"],
        name="worker", cwd=example,
    )
    await alone.wait_for_line("Worker ready", READY_TIMEOUT)
    greeter = workers.command(
        [sys.executable, "greeter.py", "--greeting", "hi", f"--ServiceArgs.dynamo.namespace={namespace}",
         f"--Worker.ServiceArgs.dynamo.namespace={namespace}"],
        name="greeter", cwd=example,
    )
    await greeter.wait_for_line("Greeter ready", READY_TIMEOUT)
    await wait_for_instances(client, 1)
    assert await request(client, "me") == ["hi me?"]


async def test_link_example(backend, workers, namespace):
    port = free_port()
    services = ("Frontend", "FastRouter", "SpongeWorker")
    serve = workers.command(
        serve_argv("llm_hello_world:Frontend", f"--Frontend.port={port}", *namespace_overrides(namespace, *services)),
        name="serve", cwd=EXAMPLES_DIR / "llm_hello_world",
    )
    for name in services:
        await serve.wait_for_line(f"{name}[0] | {name} ready", READY_TIMEOUT)
    assert sorted(started_pids(serve, "dynamo serve")) == ["FastRouter[0]", "Frontend[0]", "SpongeWorker[0]"]
    body = await http_post_async(f"http://127.0.0.1:{port}/generate", b'{"text": "hello world"}')
    words = [line.removeprefix("data: ") for line in body.splitlines() if line]
    assert [w.lower() for w in words] == ["hello", "world"], body


async def test_seed_service_a(backend, workers, runtime, namespace):
    """The seed's ServiceA/ServiceB: `await self.service_b.preprocess(...)`, a coroutine
    endpoint, async_on_start; and the Processor reaching VllmWorker through dynamo_context."""
    env = {**backend, "DYN_DISABLE_AUTO_GPU_ALLOCATION": "1"}
    ns_a = namespace_overrides(namespace, "ServiceA", "ServiceB")
    serve = workers.command(serve_argv("seed_samples:ServiceA", *ns_a), name="serve-a", cwd=GRAPHS, env=env)
    ns_p = namespace_overrides(namespace, "Processor", "VllmWorker")
    serve_p = workers.command(serve_argv("seed_samples:Processor", *ns_p), name="serve-p", cwd=GRAPHS, env=env)
    await serve.wait_for_line("ServiceA[0] | ServiceA ready", READY_TIMEOUT)
    assert serve.find_lines("ServiceA[0] | ServiceA initialized with model: meta-llama/Llama-3.1-8B-Instruct")
    client = await runtime.endpoint(f"{namespace}.ServiceA.generate").client()
    await wait_for_instances(client, 1)
    assert await request(client, {"text": "hi"}) == ["meta-llama/Llama-3.1-8B-Instruct: HI"]
    await serve_p.wait_for_line("Processor[0] | Processor ready", READY_TIMEOUT)
    assert serve_p.find_lines(f"Processor[0] | [Processor] comp_ns: {namespace}, comp_name: VllmWorker")
    processor = await runtime.endpoint(f"{namespace}.Processor.generate").client()
    await wait_for_instances(processor, 1)
    assert await request(processor, {"text": "x"}) == ["worker: x"]
    serve.send_signal(signal.SIGTERM)
    assert await serve.wait_exit(STOP_TIMEOUT) == 0
    assert serve.find_lines("ServiceA[0] | ServiceA engine shut down"), serve.describe()

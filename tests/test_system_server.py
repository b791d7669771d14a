"""The optional system HTTP server of a worker: /live, /ready, /health, /metrics."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import urllib.error
import urllib.request

from helpers import free_port, request, wait_for_instances, wait_until
from llm_helpers import launch_frontend


async def http_get(url: str) -> tuple[int, str]:
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    return await asyncio.to_thread(get)


async def test_live_health_and_metrics(runtime, workers, namespace, backend):
    port = free_port()
    env = backend.with_(DYN_SYSTEM_ENABLED="true", DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT=str(port))
    await workers.start("stream_worker.py", "--namespace", namespace, env=env)
    base = f"http://127.0.0.1:{port}"

    assert (await http_get(f"{base}/live"))[0] == 200
    status, body = await http_get(f"{base}/health")
    assert status == 200, body

    client = await runtime.namespace(namespace).component("backend").endpoint("generate").client()
    await wait_for_instances(client, 1)
    assert len(await request(client, {"count": 3})) == 3

    status, metrics = await http_get(f"{base}/metrics")
    assert status == 200
    assert "dynamo_endpoint_requests_total" in metrics, metrics[:2000]
    counted = [
        line for line in metrics.splitlines()
        if line.startswith("dynamo_endpoint_requests_total{") and f'namespace="{namespace}"' in line
    ]
    assert counted and float(counted[0].rsplit(" ", 1)[1]) >= 1, metrics[:2000]


async def test_ready_follows_registration_mark_and_drain(runtime, workers, namespace, backend, tmp_path):
    """`/ready`: 503 before registration and while the worker holds its mark, 200 once it
    gives it, 503 from the moment SIGTERM starts the drain (the instance leaves discovery)
    while an in-flight stream still finishes; then the process exits 0."""
    port = free_port()
    mark = tmp_path / "mark"
    env = backend.with_(
        DYN_SYSTEM_ENABLED="true", DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT=str(port), DYN_SHUTDOWN_TIMEOUT="20"
    )
    worker = await workers.start("ready_worker.py", "--namespace", namespace, "--mark-file", str(mark), env=env)
    instance_id = worker.instance_id
    base = f"http://127.0.0.1:{port}"

    async def ready() -> tuple[int, dict]:
        status, body = await http_get(f"{base}/ready")
        return status, json.loads(body)

    status, body = await ready()
    assert (status, body["status"]) == (503, "engine_not_ready"), body
    assert (await http_get(f"{base}/health"))[0] == 200, "/health does not follow the mark"

    mark.touch()
    assert (await worker.wait_for_line("MARKED", 10)).split() == ["MARKED", "engine_not_ready", "None"]
    status, body = await ready()
    assert (status, body["status"]) == (200, "ready"), body

    client = await runtime.namespace(namespace).component("backend").endpoint("generate").client()
    await wait_for_instances(client, 1)
    stream = await client.direct({"count": 30, "delay": 0.1}, instance_id)
    items = [await anext(stream)]
    worker.send_signal(signal.SIGTERM)

    async def draining() -> bool:
        status, body = await ready()
        return status == 503 and body["status"] == "draining"

    await wait_until(draining, 5, "/ready to answer 503 draining", ignore=(OSError, ValueError))
    await wait_until(lambda: instance_id not in client.instance_ids(), 10, "the instance to leave discovery")
    async for item in stream:
        items.append(item)
    assert [i.data()["i"] for i in items] == list(range(30)), "the in-flight stream finished during the drain"
    assert await worker.wait_exit(20) == 0, worker.describe()


async def test_ready_before_registration(workers, namespace, backend):
    """A process whose runtime serves nothing yet is not ready: the system server of a
    client-only script answers 503 `not_registered`."""
    port = free_port()
    env = backend.with_(DYN_SYSTEM_ENABLED="true", DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT=str(port))
    code = (
        "import asyncio\n"
        "from dynamo.runtime import DistributedRuntime, dynamo_worker\n"
        "@dynamo_worker()\n"
        "async def main(runtime: DistributedRuntime):\n"
        "    print('UP', flush=True)\n"
        "    await runtime.closed()\n"
        "asyncio.run(main())\n"
    )
    worker = workers.command([sys.executable, "-u", "-c", code], name="client_only", env=env)
    await worker.wait_for_line("UP", 30)
    status, body = await http_get(f"http://127.0.0.1:{port}/ready")
    assert status == 503 and json.loads(body)["status"] == "not_registered", body
    assert (await http_get(f"http://127.0.0.1:{port}/live"))[0] == 200


async def test_frontend_system_server_is_ready_once_it_serves(workers, backend):
    """A frontend registers no endpoint; with DYN_SYSTEM_ENABLED its system server's
    `/ready` answers 200 once the HTTP service listens (not 503 `not_registered` forever)."""
    port = free_port()
    env = backend.with_(DYN_SYSTEM_ENABLED="true", DYN_SYSTEM_HOST="127.0.0.1", DYN_SYSTEM_PORT=str(port))
    frontend = launch_frontend(workers, "dyn", "--http-host", "127.0.0.1", env=env)
    await frontend.wait_live()
    base = f"http://127.0.0.1:{port}"

    async def ready() -> tuple[int, str] | None:
        answer = await http_get(f"{base}/ready")
        return answer if answer[0] == 200 else None

    _, body = await wait_until(ready, 10, lambda: f"{base}/ready to answer 200", ignore=(OSError,))
    assert json.loads(body)["status"] == "ready", body

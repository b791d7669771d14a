"""The optional system HTTP server of a worker: /live, /health, /metrics."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request

from helpers import free_port, request, wait_for_instances


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

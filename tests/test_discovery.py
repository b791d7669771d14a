"""Discovery backends seen from Python: `file` across processes, `mem` within one,
and registrations that follow a process's life."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from dynamo._core import DynamoTimeoutError
from dynamo.runtime import DistributedRuntime
from helpers import (
    bounded,
    collect,
    request,
    shutdown_runtime,
    wait_for_instances,
    wait_until,
)


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
async def test_file_discovery_across_processes(runtime, workers, namespace, backend):
    assert backend["DYN_DISCOVERY_BACKEND"] == "file"
    kv_dir = Path(backend["DYN_FILE_KV"])
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    # The worker wrote its registration into the shared directory.
    assert any(kv_dir.rglob("*")), f"nothing under DYN_FILE_KV={kv_dir}"

    client = await runtime.namespace(namespace).component("backend").endpoint("generate").client()
    assert await wait_for_instances(client, 1) == [worker.instance_id]
    items = await request(client, {"count": 3})
    assert [(item["i"], item["pid"]) for item in items] == [(i, worker.pid) for i in range(3)]

    worker.terminate()
    assert worker.proc.returncode == 0, worker.describe()
    await wait_until(lambda: client.instance_ids() == [], 5, "the stopped worker to leave the file registry")


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
async def test_file_discovery_directories_are_separate(runtime, workers, namespace, backend, tmp_path):
    """A worker registered under another DYN_FILE_KV is invisible: deployments do not mix."""
    other = tmp_path / "other-kv"
    other.mkdir()
    await workers.start("stream_worker.py", "--namespace", namespace, env=backend.with_(DYN_FILE_KV=str(other)))

    client = await runtime.namespace(namespace).component("backend").endpoint("generate").client()
    with pytest.raises(DynamoTimeoutError):
        await bounded(client.wait_for_instances(timeout=1.0), 10, "wait_for_instances(timeout=1)")
    assert client.instance_ids() == []


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
async def test_mem_discovery_in_one_process(backend, namespace):
    """Arguments win over the environment: discovery="mem" serves and calls in-process."""
    rt = DistributedRuntime(asyncio.get_running_loop(), False, discovery="mem", request_plane="tcp", event_plane="tcp")
    try:
        async def handler(request):
            for word in request.split():
                yield word

        endpoint = rt.endpoint(f"{namespace}.backend.generate")
        serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
        client = await endpoint.client()
        assert await wait_for_instances(client, 1) == [rt.instance_id()]
        assert await collect(await client.generate("in one process")) == ["in", "one", "process"]
    finally:
        await shutdown_runtime(rt)
    await bounded(serving, 10, "serve_endpoint to return after shutdown")


async def test_instance_ids_are_stable_and_distinct(runtime, workers, namespace):
    first = await workers.start("stream_worker.py", "--namespace", namespace)
    second = await workers.start("stream_worker.py", "--namespace", namespace)
    assert first.instance_id != second.instance_id
    client = await runtime.namespace(namespace).component("backend").endpoint("generate").client()
    assert sorted(await wait_for_instances(client, 2)) == sorted([first.instance_id, second.instance_id])
    assert runtime.instance_id() not in client.instance_ids()
    # Every item a worker streams carries the id it announced.
    for worker in (first, second):
        items = await collect(await client.direct({"count": 2}, worker.instance_id))
        assert {item["instance_id"] for item in items} == {worker.instance_id}
        assert {item["pid"] for item in items} == {worker.pid}
    assert os.getpid() not in {first.pid, second.pid}

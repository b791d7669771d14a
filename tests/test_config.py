"""Bad configuration fails fast with a message naming the culprit; a mixed deployment
fails clearly instead of hanging."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from dynamo._core import ConfigError, DynamoError
from dynamo.runtime import DistributedRuntime
from helpers import (
    REPO_ROOT,
    bounded,
    collect,
    free_port,
    shutdown_runtime,
    wait_for_instances,
)

#: Bound on a runtime giving up on an unreachable server (DYN_CONNECT_TIMEOUT defaults to 5 s).
UNREACHABLE_BOUND = 20.0


def test_error_hierarchy():
    from dynamo import _core

    assert issubclass(_core.HandlerError, ValueError)
    for name in ("NoInstancesError", "InstanceNotFoundError", "PayloadTooLargeError",
                 "StreamDisconnectedError", "DynamoTimeoutError", "ConfigError"):
        assert issubclass(getattr(_core, name), DynamoError), name
    assert issubclass(DynamoError, Exception)


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
async def test_unknown_discovery_argument(backend):
    with pytest.raises(ConfigError) as raised:
        DistributedRuntime(asyncio.get_running_loop(), False, discovery="bogus")
    assert "bogus" in str(raised.value)


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
@pytest.mark.parametrize(
    "key, value",
    [("DYN_REQUEST_PLANE", "carrier-pigeon"), ("DYN_LEASE_TTL", "-1"), ("DYN_SYSTEM_PORT", "http")],
)
async def test_bad_environment_value_names_the_key(backend, monkeypatch, key, value):
    monkeypatch.setenv(key, value)
    with pytest.raises(ConfigError) as raised:
        DistributedRuntime(asyncio.get_running_loop(), False)
    assert key in str(raised.value)


# The runtime is built in a child process so that even a runtime that never gave up
# could not hang the test run.
PROBE = """
import asyncio, json, sys, time
from dynamo.runtime import DistributedRuntime

async def main():
    start = time.monotonic()
    try:
        rt = DistributedRuntime(asyncio.get_running_loop(), False)
    except Exception as e:
        return {"error": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "message": str(e),
                "elapsed": time.monotonic() - start}
    rt.shutdown()
    return {"error": None, "elapsed": time.monotonic() - start}

print("RESULT " + json.dumps(asyncio.run(main())))
"""


def probe_runtime(env: dict[str, str]) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=UNREACHABLE_BOUND + 10,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"probe printed no result (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
def test_nats_server_where_nothing_listens(backend):
    nowhere = f"nats://127.0.0.1:{free_port()}"
    result = probe_runtime(backend.with_(DYN_REQUEST_PLANE="nats", NATS_SERVER=nowhere))
    assert result["error"] is not None, "a runtime started against a NATS server that does not exist"
    assert "DynamoError" in result["mro"], result
    assert "nats" in result["message"].lower(), result
    assert result["elapsed"] < UNREACHABLE_BOUND, result


@pytest.mark.parametrize("backend", ["etcd_nats"], indirect=True)
def test_etcd_where_nothing_listens(backend):
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = probe_runtime(backend.with_(ETCD_ENDPOINTS=nowhere))
    assert result["error"] is not None, "a runtime started against an etcd that does not exist"
    assert "DynamoError" in result["mro"], result
    assert "etcd" in result["message"].lower() or nowhere in result["message"], result
    assert result["elapsed"] < UNREACHABLE_BOUND, result


@pytest.mark.parametrize("backend", ["etcd_nats"], indirect=True)
async def test_mixed_request_planes_fail_clearly(backend, workers, namespace, monkeypatch):
    """A worker on the NATS request plane, a caller without NATS: a clear error, at once."""
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    monkeypatch.setenv("DYN_REQUEST_PLANE", "tcp")
    monkeypatch.setenv("DYN_EVENT_PLANE", "tcp")
    rt = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        client = await rt.namespace(namespace).component("backend").endpoint("generate").client()
        assert await wait_for_instances(client, 1) == [worker.instance_id]

        async def attempt() -> None:
            await collect(await client.generate({"count": 1}))

        with pytest.raises(DynamoError) as raised:
            await bounded(attempt(), 10, "a request across mismatched request planes")
        assert "NATS" in str(raised.value), str(raised.value)
    finally:
        await shutdown_runtime(rt)

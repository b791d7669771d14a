"""Failures the caller must see as errors, quickly: a worker dying mid-stream, a dead
instance still in discovery, a payload over the request plane's limit."""

from __future__ import annotations

import time

import pytest
from dynamo._core import DynamoError, PayloadTooLargeError, StreamDisconnectedError
from helpers import LEASE_TTL, bounded, collect, data_of, request, wait_for_instances, wait_until

#: Bound on the caller noticing that the worker of its stream died.
DEATH_NOTICE_TIMEOUT = 10.0
#: Bound on a dead instance leaving discovery (lease TTL / heartbeat expiry, with slack).
VANISH_TIMEOUT = 3 * LEASE_TTL + 4


async def client_of(runtime, namespace: str):
    return await runtime.namespace(namespace).component("backend").endpoint("generate").client()


async def test_worker_killed_mid_stream_gives_caller_an_error(runtime, workers, namespace):
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    stream = await client.generate({"count": 10_000, "delay": 0.02})
    received = []

    async def first_three() -> None:
        async for item in stream:
            received.append(data_of(item))
            if len(received) == 3:
                return

    await bounded(first_three(), 10, "the first items of the stream")
    assert len(received) == 3
    worker.kill()
    killed_at = time.monotonic()

    async def drain() -> None:
        async for item in stream:
            received.append(data_of(item))

    with pytest.raises(DynamoError) as raised:
        await bounded(drain(), DEATH_NOTICE_TIMEOUT, "an error after the worker was SIGKILLed")
    noticed_after = time.monotonic() - killed_at

    assert len(received) < 10_000
    assert noticed_after < DEATH_NOTICE_TIMEOUT
    # The kind of error says what happened (a subclass; DynamoError itself is acceptable).
    print(f"worker death surfaced as {type(raised.value).__name__} after {noticed_after:.2f}s: {raised.value}")
    assert isinstance(raised.value, (StreamDisconnectedError, DynamoError))


async def test_requests_succeed_after_one_of_two_workers_is_killed(runtime, workers, namespace):
    doomed = await workers.start("stream_worker.py", "--namespace", namespace)
    survivor = await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 2)

    doomed.kill()

    # During the lease/heartbeat window some requests may fail; keep sending.
    failures = 0

    async def vanished() -> bool:
        nonlocal failures
        if doomed.instance_id not in client.instance_ids():
            return True
        try:
            await request(client, {"count": 2}, timeout=10)
        except DynamoError:
            failures += 1
        return False

    await wait_until(
        vanished, VANISH_TIMEOUT, f"the killed instance to leave discovery (DYN_LEASE_TTL={LEASE_TTL})", interval=0.1
    )
    assert client.instance_ids() == [survivor.instance_id]
    print(f"{failures} request(s) failed while the dead instance was still registered")

    for n in range(20):
        items = await request(client, {"count": 2, "tag": n}, timeout=10)
        assert [item["i"] for item in items] == [0, 1]
        assert {item["instance_id"] for item in items} == {survivor.instance_id}


TEN_MB = 10 * 1024 * 1024


async def test_ten_megabyte_payload(runtime, workers, namespace, backend):
    await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)
    blob = "x" * TEN_MB

    if backend.overrides["DYN_REQUEST_PLANE"] == "tcp":
        items = await request(client, {"blob": blob}, timeout=30)
        assert items[0]["length"] == TEN_MB
    else:
        # NATS refuses messages above the server's max_payload (1 MiB by default).
        async def attempt() -> None:
            await collect(await client.generate({"blob": blob}), timeout=30)

        with pytest.raises(PayloadTooLargeError) as raised:
            await bounded(attempt(), 30, "a 10 MB request on the NATS plane")
        message = str(raised.value)
        assert "1048576" in message or "max_payload" in message, message

    # Either way the client keeps working.
    assert len(await request(client, {"count": 3})) == 3

"""Graceful shutdown: SIGTERM stops a worker taking requests, drains what is in flight,
removes its registration and exits 0."""

from __future__ import annotations

import signal

from helpers import bounded, data_of, wait_for_instances, wait_until


async def client_of(runtime, namespace: str):
    return await runtime.namespace(namespace).component("backend").endpoint("generate").client()


async def test_sigterm_mid_stream_drains_it(runtime, workers, namespace):
    """Graceful shutdown: the in-flight stream completes, the worker exits 0 and its
    instance leaves discovery."""
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    stream = await client.generate({"count": 20, "delay": 0.05})
    received = []

    async def read_all() -> None:
        async for item in stream:
            received.append(data_of(item))
            if len(received) == 3:
                worker.send_signal(signal.SIGTERM)

    await bounded(read_all(), 20, "the in-flight stream to drain after SIGTERM")

    assert [item["i"] for item in received] == list(range(20))
    assert await worker.wait_exit(15) == 0, worker.describe()
    await wait_until(
        lambda: worker.instance_id not in client.instance_ids(),
        5,
        f"instance {worker.instance_id} to leave discovery after graceful shutdown",
    )

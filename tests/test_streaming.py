"""Requests and response streams across processes: order, concurrency, routing modes,
unknown instances, handler errors, request and item types."""

from __future__ import annotations

import asyncio

import pydantic
import pytest
from dynamo._core import (
    DynamoError,
    HandlerError,
    InstanceNotFoundError,
    NoInstancesError,
)
from helpers import bounded, collect, data_of, request, wait_for_instances


async def client_of(runtime, namespace: str, endpoint: str = "generate"):
    return await runtime.namespace(namespace).component("backend").endpoint(endpoint).client()


async def test_thousand_items_arrive_in_order(runtime, workers, namespace):
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    items = await request(client, {"count": 1000, "tag": "order"})

    assert [item["i"] for item in items] == list(range(1000))
    assert {item["instance_id"] for item in items} == {worker.instance_id}


async def test_hundred_concurrent_streams(runtime, workers, namespace):
    await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    async def one(n: int) -> list:
        return await request(client, {"count": 20, "tag": n, "delay": 0.001}, timeout=60)

    results = await bounded(asyncio.gather(*(one(n) for n in range(100))), 60, "100 concurrent streams")

    for n, items in enumerate(results):
        assert [(item["tag"], item["i"]) for item in items] == [(n, i) for i in range(20)], f"stream {n}"


async def test_round_robin_reaches_every_worker(runtime, workers, namespace):
    started = [await workers.start("stream_worker.py", "--namespace", namespace) for _ in range(3)]
    expected = {w.instance_id for w in started}
    client = await client_of(runtime, namespace)
    ids = await wait_for_instances(client, 3)
    assert set(ids) == expected

    served_by = []
    for n in range(9):
        stream = await client.round_robin({"count": 1, "tag": n})
        items = await collect(stream)
        served_by.append(items[0]["instance_id"])

    assert set(served_by) == expected
    # Each instance in turn: every window of three requests covers all three.
    for start in range(0, 9, 3):
        assert set(served_by[start:start + 3]) == expected, served_by


async def test_direct_and_random_route_to_registered_instances(runtime, workers, namespace):
    started = [await workers.start("stream_worker.py", "--namespace", namespace) for _ in range(2)]
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 2)

    for worker in started:
        for _ in range(3):
            items = await collect(await client.direct({"count": 2}, worker.instance_id))
            assert [item["instance_id"] for item in items] == [worker.instance_id] * 2

    for _ in range(6):
        items = await collect(await client.random({"count": 1}))
        assert items[0]["instance_id"] in {w.instance_id for w in started}


async def test_no_instances_fails_at_once(runtime, namespace):
    client = await client_of(runtime, namespace)
    assert client.instance_ids() == []

    async def attempt() -> None:
        await collect(await client.generate({"count": 1}))

    with pytest.raises(NoInstancesError) as raised:
        await bounded(attempt(), 10, "generate() with no instance registered")
    assert f"{namespace}" in str(raised.value), str(raised.value)


async def test_direct_to_unknown_instance_fails_clearly(runtime, workers, namespace):
    worker = await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)
    unknown = worker.instance_id ^ 0x5A5A5A5A

    async def attempt() -> None:
        await collect(await client.direct({"count": 1}, unknown))

    with pytest.raises(InstanceNotFoundError) as raised:
        await bounded(attempt(), 10, "direct() to an unknown instance")

    assert isinstance(raised.value, DynamoError)
    message = str(raised.value)
    assert str(unknown) in message or f"{unknown:x}" in message, message
    # The client still works.
    assert len(await collect(await client.direct({"count": 1}, worker.instance_id))) == 1


@pytest.mark.parametrize("fail_at", [0, 3], ids=["before-first-item", "mid-stream"])
async def test_handler_value_error_reaches_caller(runtime, workers, namespace, fail_at):
    await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    received = []

    async def run() -> None:
        stream = await client.generate({"count": 10, "fail_at": fail_at, "message": "x marks the spot"})
        async for item in stream:
            received.append(data_of(item))

    with pytest.raises(HandlerError) as raised:
        await bounded(run(), 10, "a stream whose handler raises")

    assert isinstance(raised.value, ValueError)
    assert "x marks the spot" in str(raised.value)
    assert [item["i"] for item in received] == list(range(fail_at))
    # The same client (and connection) keeps working.
    items = await request(client, {"count": 5})
    assert [item["i"] for item in items] == list(range(5))


async def test_annotated_items_and_raw_items(runtime, workers, namespace):
    await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    annotated = await asyncio.wait_for(_items(await client.generate({"count": 2})), 10)
    for n, item in enumerate(annotated):
        assert not item.is_error()
        assert item.data()["i"] == n

    raw = await asyncio.wait_for(_items(await client.generate({"count": 2}, annotated=False)), 10)
    assert [item["i"] for item in raw] == [0, 1]


async def _items(stream) -> list:
    return [item async for item in stream]


class CountRequest(pydantic.BaseModel):
    count: int
    tag: str


async def test_pydantic_request_and_json_types(runtime, workers, namespace):
    await workers.start("stream_worker.py", "--namespace", namespace)
    client = await client_of(runtime, namespace)
    await wait_for_instances(client, 1)

    items = await request(client, CountRequest(count=3, tag="model"))
    assert [(item["i"], item["tag"]) for item in items] == [(0, "model"), (1, "model"), (2, "model")]

    # A plain string request is passed through as a string.
    items = await request(client, "just text")
    assert items[0]["tag"] == "just text"

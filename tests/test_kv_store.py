"""The discovery backend's key-value store from Python (`kv_store()` / `etcd_client()`)."""

from __future__ import annotations

import asyncio

import pytest
from dynamo._core import ConfigError, DynamoError
from dynamo.runtime import DistributedRuntime
from helpers import shutdown_runtime, wait_until


async def test_put_get_prefix_and_create(runtime, namespace):
    kv = runtime.etcd_client()
    assert kv.primary_lease_id() == runtime.kv_store().primary_lease_id()
    await kv.kv_put(f"{namespace}/a", b"1")
    await kv.kv_put(f"{namespace}/b", b"2", 0)
    await kv.kv_put(f"{namespace}_other/c", b"3")
    assert await kv.kv_get(f"{namespace}/a") == b"1"
    assert await kv.kv_get(f"{namespace}/missing") is None
    found = await kv.kv_get_prefix(f"{namespace}/")
    assert [(e["key"], e["value"]) for e in found] == [(f"{namespace}/a", b"1"), (f"{namespace}/b", b"2")]

    await kv.kv_create(f"{namespace}/new", b"x")
    with pytest.raises(DynamoError, match="already exists"):
        await kv.kv_create(f"{namespace}/new", b"y")
    await kv.kv_create_or_validate(f"{namespace}/new", b"x")
    with pytest.raises(DynamoError, match="different value"):
        await kv.kv_create_or_validate(f"{namespace}/new", b"other")
    with pytest.raises(ConfigError, match="not this process's lease"):
        await kv.kv_put(f"{namespace}/z", b"1", 12345)

    await kv.kv_delete(f"{namespace}/a")
    assert await kv.kv_get(f"{namespace}/a") is None
    await kv.kv_delete(f"{namespace}/b")


async def test_leased_keys_vanish_with_their_process(runtime, namespace):
    other = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        await other.kv_store().kv_put(f"{namespace}/leased", b"1")
        await other.kv_store().kv_put(f"{namespace}/kept", b"2", 0)
    finally:
        await shutdown_runtime(other)
    kv = runtime.kv_store()

    async def keys() -> list[str]:
        return [e["key"] for e in await kv.kv_get_prefix(f"{namespace}/")]

    got: list[str] = []

    async def only_kept() -> bool:
        nonlocal got
        got = await keys()
        return got == [f"{namespace}/kept"]

    await wait_until(only_kept, 10.0, lambda: f"only {namespace}/kept (still {got})")
    await kv.kv_delete(f"{namespace}/kept")


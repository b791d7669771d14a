"""``EtcdKvCache``: a few shared settings under one key prefix in the discovery store
(etcd, or the embedded file/mem store), e.g. a router mode that operators may change
while the graph runs.

```python
cache = await EtcdKvCache.create(runtime.etcd_client(), "/dynamo/processor/", {"router": "round-robin"})
mode = (await cache.get("router")).decode()      # b"round-robin" unless someone changed it
await cache.put("router", "kv")
```

Reads go to the store every time (no local copy that could go stale), so every process
sees a change at its next read. Initial values are written only where a key is absent:
the first process to create the cache wins, later ones keep what is there. Initial
values live as long as the process that wrote them (they are bound to its lease, as the
store's ``kv_create`` requires); ``put`` can write a key that outlives it.
"""

from __future__ import annotations

from typing import Any

from dynamo._core import DynamoError, KeyValueStore


def _as_bytes(value: str | bytes) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"EtcdKvCache values are str or bytes, got {type(value).__name__}")


class EtcdKvCache:
    """Keys under ``prefix`` in the discovery store; build it with :meth:`create`."""

    def __init__(self, store: KeyValueStore, prefix: str, _token: object = None) -> None:
        if _token is not _CREATE:
            raise TypeError("use `await EtcdKvCache.create(etcd_client, prefix, initial_values)`")
        self._store = store
        self._prefix = prefix

    @classmethod
    async def create(
        cls, etcd_client: KeyValueStore, prefix: str, initial_values: dict[str, str | bytes] | None = None
    ) -> EtcdKvCache:
        """The cache of ``prefix`` (``runtime.etcd_client()`` is the store). Each initial
        value is written, bound to this process's lease, unless its key exists."""
        if not isinstance(prefix, str) or not prefix:
            raise ValueError("EtcdKvCache needs a non-empty key prefix")
        cache = cls(etcd_client, prefix, _CREATE)
        for key, value in (initial_values or {}).items():
            data = _as_bytes(value)
            if await etcd_client.kv_get(cache._key(key)) is not None:
                continue
            try:
                await etcd_client.kv_create(cache._key(key), data, None)
            except DynamoError:
                # Another process created it between our read and our write: it wins.
                if await etcd_client.kv_get(cache._key(key)) is None:
                    raise
        return cache

    @property
    def prefix(self) -> str:
        return self._prefix

    def _key(self, key: str) -> str:
        return f"{self._prefix}{key}"

    async def get(self, key: str) -> bytes | None:
        """The value of ``key``, or ``None``."""
        return await self._store.kv_get(self._key(key))

    async def get_all(self) -> dict[str, bytes]:
        """Every key under the prefix (prefix removed) with its value."""
        items: list[dict[str, Any]] = await self._store.kv_get_prefix(self._prefix)
        return {item["key"][len(self._prefix):]: item["value"] for item in items}

    async def put(self, key: str, value: str | bytes, lease_id: int | None = 0) -> None:
        """Write ``key``. ``lease_id``: ``0`` (default) keeps it after this process ends,
        ``None`` binds it to this process's lease."""
        await self._store.kv_put(self._key(key), _as_bytes(value), lease_id)

    async def delete(self, key: str) -> None:
        """Remove ``key``."""
        await self._store.kv_delete(self._key(key))

    async def clear_all(self) -> None:
        """Remove every key under the prefix."""
        for key in await self.get_all():
            await self.delete(key)


_CREATE = object()

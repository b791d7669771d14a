"""An engine's KV cache events on the event plane, where KV routers follow the
component: engines that publish them over ZMQ in vLLM's format (vLLM, SGLang) go through
the ZMQ bridge (``dynamo.llm.ZmqKvEventPublisher``); engines with an in-process event
API (TensorRT-LLM) yield :data:`KvEvent` values, published here with a
``KvEventPublisher``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("dynamo.engine")


@dataclass(frozen=True)
class ZmqKvEvents:
    """The engine publishes on this ZMQ PUB endpoint (a wildcard host is read as
    loopback: the engine runs beside the worker)."""

    endpoint: str

    def subscribe_endpoint(self) -> str:
        return self.endpoint.replace("*", "127.0.0.1").replace("0.0.0.0", "127.0.0.1")


@dataclass(frozen=True)
class BlocksStored:
    """Blocks entered the cache: ``token_ids`` split into blocks of ``num_block_tokens``
    tokens named ``block_hashes`` by the engine, the first following ``parent_hash``."""

    event_id: int
    token_ids: list[int]
    num_block_tokens: list[int]
    block_hashes: list[int]
    parent_hash: int | None = None


@dataclass(frozen=True)
class BlocksRemoved:
    """Blocks (the engine's ids) left the cache."""

    event_id: int
    block_hashes: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class BlocksCleared:
    """The whole cache was dropped."""

    event_id: int


KvEvent = BlocksStored | BlocksRemoved | BlocksCleared
#: What :meth:`EngineAdapter.kv_events` returns.
KvEventSource = ZmqKvEvents | AsyncIterator[KvEvent]


def publish(publisher: Any, event: KvEvent) -> bool:
    """One event through a ``KvEventPublisher``; False when its queue was full."""
    if isinstance(event, BlocksStored):
        return bool(publisher.publish_stored(
            event.event_id, event.token_ids, event.num_block_tokens, event.block_hashes,
            parent_hash=event.parent_hash,
        ))
    if isinstance(event, BlocksRemoved):
        return bool(publisher.publish_removed(event.event_id, event.block_hashes))
    return bool(publisher.publish_cleared(event.event_id))


class KvEventBridge:
    """Runs an engine's event source into the component's ``kv_events`` subject until
    :meth:`shutdown`."""

    def __init__(self, component: Any, source: KvEventSource, block_size: int) -> None:
        self._zmq: Any = None
        self._task: asyncio.Task[None] | None = None
        if isinstance(source, ZmqKvEvents):
            from dynamo.llm import ZmqKvEventPublisher, ZmqKvEventPublisherConfig

            # The engine's ZMQ publisher binds the endpoint; this process subscribes.
            self._zmq = ZmqKvEventPublisher(
                component,
                ZmqKvEventPublisherConfig(kv_block_size=block_size, zmq_endpoint=source.subscribe_endpoint()),
            )
        else:
            from dynamo.llm import KvEventPublisher

            publisher = KvEventPublisher(component, kv_block_size=block_size)
            self._task = asyncio.ensure_future(self._pump(publisher, source))

    @staticmethod
    async def _pump(publisher: Any, events: AsyncIterator[KvEvent]) -> None:
        dropped = 0
        try:
            async for event in events:
                if not publish(publisher, event):
                    dropped += 1
                    log.warning("KV event %d dropped (event-plane queue full; %d so far)", event.event_id, dropped)
        except Exception as e:
            # Routing goes on without this worker's events (approximate); serving is unaffected.
            log.error("the engine's KV events stopped: %s", e)

    async def shutdown(self) -> None:
        if self._zmq is not None:
            await self._zmq.shutdown()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

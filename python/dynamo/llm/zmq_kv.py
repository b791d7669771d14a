"""KV events from engines that publish them over ZMQ in vLLM's format, republished on
Dynamo's event plane (the component's ``kv_events`` subject) for routers and indexers.

vLLM (``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq"}'``)
sends multipart messages ``[topic, seq (8-byte big-endian), payload]`` on a PUB socket;
the payload is a msgpack ``KVEventBatch`` ``[ts, events, data_parallel_rank?]`` whose
events are ``BlockStored``, ``BlockRemoved`` and ``AllBlocksCleared``, each a map with a
``type`` field or (older vLLM) an array whose first item is the type. Needs the ``zmq``
extra (``pip install 'ai-dynamo[zmq]'``: pyzmq and msgpack).

```python
config = ZmqKvEventPublisherConfig(kv_block_size=16, zmq_endpoint="tcp://127.0.0.1:5557")
bridge = ZmqKvEventPublisher(component, config)  # inside the running event loop
...
await bridge.shutdown()
```
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from dynamo._core import Component, KvEventPublisher

log = logging.getLogger(__name__)

__all__ = ["VllmKvEvent", "ZmqKvEventPublisher", "ZmqKvEventPublisherConfig", "decode_kv_event_batch"]

#: Field order of vLLM's array-encoded events (after the type tag).
_STORED_FIELDS = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name")
_REMOVED_FIELDS = ("block_hashes", "medium")


@dataclass(frozen=True)
class VllmKvEvent:
    """One decoded vLLM KV event: ``type`` is ``BlockStored``, ``BlockRemoved`` or
    ``AllBlocksCleared``; block ids are already 64-bit integers (see :func:`block_id`)."""

    type: str
    block_hashes: list[int] = field(default_factory=list)
    parent_block_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 0
    lora_name: str | None = None


def block_id(value: int | bytes) -> int:
    """A vLLM block hash as a 64-bit id: integers as they are (signed ones bitwise),
    byte strings (sha256 hashing) by their first 8 bytes, little-endian."""
    if isinstance(value, bytes):
        if not value:
            raise ValueError("empty block hash")
        return int.from_bytes(value[:8].ljust(8, b"\0"), "little")
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"a block hash must be an int or bytes, got {type(value).__name__}")
    return value & 0xFFFF_FFFF_FFFF_FFFF


def _event(raw: Any) -> VllmKvEvent:
    if isinstance(raw, (list, tuple)):
        if not raw:
            raise ValueError("empty event")
        kind, values = raw[0], raw[1:]
        names = _STORED_FIELDS if kind == "BlockStored" else _REMOVED_FIELDS if kind == "BlockRemoved" else ()
        fields = dict(zip(names, values, strict=False))  # trailing defaults may be omitted
    elif isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    else:
        raise ValueError(f"an event must be a map or an array, got {type(raw).__name__}")
    if kind == "BlockStored":
        parent = fields.get("parent_block_hash")
        return VllmKvEvent(
            type=kind,
            block_hashes=[block_id(h) for h in fields["block_hashes"]],
            parent_block_hash=None if parent is None else block_id(parent),
            token_ids=list(fields["token_ids"]),
            block_size=int(fields["block_size"]),
            lora_name=fields.get("lora_name"),
        )
    if kind == "BlockRemoved":
        return VllmKvEvent(type=kind, block_hashes=[block_id(h) for h in fields["block_hashes"]])
    if kind == "AllBlocksCleared":
        return VllmKvEvent(type=kind)
    raise ValueError(f"unknown KV event type {kind!r}")


def decode_kv_event_batch(payload: bytes) -> tuple[float, list[VllmKvEvent]]:
    """Decode a msgpack ``KVEventBatch`` into its timestamp and events.

    Raises:
        ValueError: the payload is not such a batch.
    """
    import msgpack

    try:
        batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as e:  # msgpack raises several unrelated types
        raise ValueError(f"not msgpack: {e}") from e
    if not isinstance(batch, (list, tuple)) or len(batch) < 2 or not isinstance(batch[1], (list, tuple)):
        raise ValueError("a KVEventBatch is an array [ts, events, ...]")
    try:
        return float(batch[0]), [_event(e) for e in batch[1]]
    except (KeyError, TypeError) as e:
        raise ValueError(f"malformed KV event: {e!r}") from e


@dataclass
class ZmqKvEventPublisherConfig:
    """Where to read an engine's ZMQ KV events and as which worker to republish them."""

    #: The worker id routers know the engine by; ``None``: this process's instance id.
    worker_id: int | None = None
    #: Tokens per KV block (the engine's block size).
    kv_block_size: int = 16
    #: The engine's ZMQ PUB endpoint.
    zmq_endpoint: str = "tcp://127.0.0.1:5557"
    #: Topic prefix to subscribe to (``""``: everything).
    zmq_topic: str = ""


@dataclass
class ZmqStats:
    """What the bridge has seen."""

    batches: int = 0
    events: int = 0
    #: Payloads that did not decode (skipped).
    decode_errors: int = 0
    #: Sequence numbers skipped by the engine's publisher (batches lost).
    seq_gaps: int = 0
    #: Events dropped because the event-plane publisher's queue was full.
    dropped: int = 0


class ZmqKvEventPublisher:
    """Subscribe to an engine's ZMQ KV events and republish them with a
    :class:`KvEventPublisher`. Create it inside a running event loop; it reads in a task
    until :meth:`shutdown`. Batches that do not decode are logged and skipped; a gap in
    the engine's sequence numbers becomes a gap in ``event_id`` (indexes count it)."""

    def __init__(self, component: Component, config: ZmqKvEventPublisherConfig):
        try:
            import msgpack  # noqa: F401
            import zmq
            import zmq.asyncio
        except ImportError as e:
            raise ImportError(
                "ZmqKvEventPublisher needs pyzmq and msgpack: pip install 'ai-dynamo[zmq]'"
            ) from e
        self.config = config
        self.stats = ZmqStats()
        self._publisher = KvEventPublisher(component, config.worker_id, config.kv_block_size)
        self._context = zmq.asyncio.Context()
        self._socket = self._context.socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.connect(config.zmq_endpoint)
        self._socket.setsockopt_string(zmq.SUBSCRIBE, config.zmq_topic)
        self._next_event_id = 0
        self._last_seq: int | None = None
        self._task = asyncio.get_running_loop().create_task(self._run())

    @property
    def worker_id(self) -> int:
        """The worker id the republished events carry."""
        return self._publisher.worker_id

    async def _run(self) -> None:
        while True:
            frames = await self._socket.recv_multipart()
            self.handle(frames)

    def handle(self, frames: list[bytes]) -> None:
        """Republish one multipart message ``[topic, seq, payload]`` (public for tests
        and for engines that hand over messages themselves)."""
        if len(frames) != 3 or len(frames[1]) != 8:
            self.stats.decode_errors += 1
            log.warning("ignoring a ZMQ KV message of %d frames (expected [topic, seq, payload])", len(frames))
            return
        seq = int.from_bytes(frames[1], "big")
        if self._last_seq is not None and seq > self._last_seq + 1:
            self.stats.seq_gaps += 1
            self._next_event_id += 1  # let indexes see that something was lost
            log.warning("KV event batches %d..%d were lost", self._last_seq + 1, seq - 1)
        self._last_seq = seq
        try:
            _, events = decode_kv_event_batch(frames[2])
        except ValueError as e:
            self.stats.decode_errors += 1
            log.warning("ignoring an undecodable KV event batch (seq %d): %s", seq, e)
            return
        self.stats.batches += 1
        for event in events:
            try:
                self._publish(event)
            except ValueError as e:
                self.stats.decode_errors += 1
                log.warning("ignoring a malformed %s event (seq %d): %s", event.type, seq, e)

    def _publish(self, event: VllmKvEvent) -> None:
        event_id = self._next_event_id
        self._next_event_id += 1
        self.stats.events += 1
        if event.type == "BlockStored":
            if event.block_size != self.config.kv_block_size:
                log.warning("BlockStored with block_size %d, configured %d: its blocks are not indexed",
                            event.block_size, self.config.kv_block_size)
            sent = self._publisher.publish_stored(
                event_id, event.token_ids, [event.block_size] * len(event.block_hashes),
                event.block_hashes, event.lora_name, event.parent_block_hash,
            )
        elif event.type == "BlockRemoved":
            sent = self._publisher.publish_removed(event_id, event.block_hashes)
        else:
            sent = self._publisher.publish_cleared(event_id)
        if not sent:
            self.stats.dropped += 1

    async def shutdown(self) -> None:
        """Stop reading and close the socket."""
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._socket.close(linger=0)
        self._context.term()

"""vLLM's ZMQ KV events (msgpack `KVEventBatch`es from a pyzmq PUB socket) republished
on the event plane by `ZmqKvEventPublisher` and indexed by a `KvIndexer`."""

from __future__ import annotations

import time
from typing import Any

import pytest

zmq = pytest.importorskip("zmq", reason="the ZMQ KV source needs pyzmq (pip install 'ai-dynamo[zmq]')")
msgpack = pytest.importorskip("msgpack", reason="the ZMQ KV source needs msgpack (pip install 'ai-dynamo[zmq]')")

from dynamo.llm import KvIndexer, ZmqKvEventPublisher, ZmqKvEventPublisherConfig  # noqa: E402
from dynamo.llm.zmq_kv import block_id, decode_kv_event_batch  # noqa: E402
from helpers import free_port, wait_until  # noqa: E402

#: Bound on events getting from the PUB socket into the indexer (PUB/SUB joins late, so
#: the test publishes repeatedly meanwhile).
DELIVERY_TIMEOUT = 15.0
BLOCK = 4


def stored(hashes: list[Any], tokens: list[int], parent: Any = None, *, array: bool = False) -> Any:
    """A `BlockStored` as vLLM's msgspec encodes it: a map with `type` (current vLLM) or
    an array tagged by its first item (older vLLM)."""
    if array:
        return ["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU"]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": tokens,
            "block_size": BLOCK, "lora_id": None, "medium": "GPU", "lora_name": None}


def batch(*events: Any) -> bytes:
    return msgpack.packb([time.time(), list(events)], use_bin_type=True)


def test_decoding_both_encodings_and_bytes_hashes():
    digest = bytes(range(32))  # a sha256-style block hash
    ts, events = decode_kv_event_batch(batch(
        stored([1, -2], list(range(8))),
        stored([digest], list(range(4)), parent=1, array=True),
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
        ["BlockRemoved", [digest]],
        {"type": "AllBlocksCleared"},
        ["AllBlocksCleared"],
    ))
    assert ts > 0
    assert [e.type for e in events] == ["BlockStored", "BlockStored", "BlockRemoved", "BlockRemoved",
                                        "AllBlocksCleared", "AllBlocksCleared"]
    assert events[0].block_hashes == [1, 2**64 - 2]
    assert events[1].block_hashes == [block_id(digest)] and events[1].parent_block_hash == 1
    assert events[1].token_ids == [0, 1, 2, 3] and events[1].block_size == BLOCK
    assert events[3].block_hashes == [int.from_bytes(digest[:8], "little")]
    for bad in (b"\xc1", msgpack.packb({"ts": 1}), batch({"type": "BlockMoved"}), batch({"type": "BlockStored"})):
        with pytest.raises(ValueError):
            decode_kv_event_batch(bad)


async def test_zmq_events_reach_the_indexer(runtime, namespace):
    component = runtime.namespace(namespace).component("vllm")
    indexer = KvIndexer(component, BLOCK)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    bridge = ZmqKvEventPublisher(component, ZmqKvEventPublisherConfig(
        worker_id=77, kv_block_size=BLOCK, zmq_endpoint=endpoint, zmq_topic="kv"))
    seq = 0
    tokens = list(range(12))

    async def send_until(payload: bytes, expected: dict[int, int], what: str) -> None:
        # PUB/SUB joins late: resend until the index shows it.
        scores: dict[int, int] = {}

        async def indexed() -> bool:
            nonlocal seq, scores
            scores = (await indexer.find_matches_for_request(tokens)).scores
            if scores == expected:
                return True
            pub.send_multipart([b"kv", seq.to_bytes(8, "big"), payload])
            seq += 1
            return False

        await wait_until(
            indexed, DELIVERY_TIMEOUT,
            lambda: f"{what}: indexer shows {scores}, expected {expected} (bridge {bridge.stats})", interval=0.1,
        )

    try:
        assert bridge.worker_id == 77
        # Three blocks in two events (the second follows the first by parent hash).
        await send_until(batch(stored([10, 11], tokens[:8]), stored([12], tokens[8:], parent=11, array=True)),
                         {77: 3}, "stored blocks")
        await send_until(batch({"type": "BlockRemoved", "block_hashes": [11], "medium": "GPU"}), {77: 1},
                         "a removed block")
        await send_until(batch(["AllBlocksCleared"]), {}, "a cleared cache")
        # Another topic is not followed; garbage is counted and skipped.
        pub.send_multipart([b"other", seq.to_bytes(8, "big"), batch(stored([10], tokens[:4]))])
        pub.send_multipart([b"kv", (seq + 5).to_bytes(8, "big"), b"\xc1"])
        errors_before = bridge.stats.decode_errors
        await wait_until(lambda: bridge.stats.decode_errors != errors_before, DELIVERY_TIMEOUT,
                         "the undecodable batch to be seen")
        assert bridge.stats.seq_gaps >= 1
        assert (await indexer.find_matches_for_request(tokens)).scores == {}
        assert indexer.stats()["unknown_parents"] == 0
    finally:
        await bridge.shutdown()
        pub.close()
        context.term()

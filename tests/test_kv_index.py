"""The KV index from Python: block hashing, `RadixTree` with the reference's JSON
events, and an engine's `KvEventPublisher`/`WorkerMetricsPublisher` in another process
feeding a `KvIndexer` over the real event plane (both backends)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from dynamo.llm import (
    KvEventPublisher,
    KvIndexer,
    OverlapScores,
    RadixTree,
    compute_block_hash_for_seq,
)
from helpers import STREAM_TIMEOUT, request, wait_until

#: Bound on events crossing the event plane into the indexer (publishers repeat meanwhile).
DELIVERY_TIMEOUT = 15.0


def stored(event_id: int, blocks: list[tuple[int, int]], parent: int | None = None) -> bytes:
    data = {"stored": {"parent_hash": parent, "blocks": [{"block_hash": b, "tokens_hash": t} for b, t in blocks]}}
    return json.dumps({"event_id": event_id, "data": data}).encode()


def test_block_hashes_match_the_reference():
    # The example event carries this tokens hash; it is xxh3-64 (seed 1337) of
    # the block's tokens as little-endian u32.
    hashes = compute_block_hash_for_seq(list(range(64)), 16)
    assert len(hashes) == 4
    assert compute_block_hash_for_seq(list(range(70)), 16) == hashes  # partial block: no hash
    assert compute_block_hash_for_seq(list(range(15)), 16) == []
    assert compute_block_hash_for_seq(list(range(64)), 16, lora_name="a") != hashes
    with pytest.raises(ValueError, match="block_size"):
        compute_block_hash_for_seq([1, 2], 0)
    with pytest.raises(OverflowError):
        compute_block_hash_for_seq([-1], 1)


def test_token_lists_of_any_ints_hash_like_tuples():
    # Lists are read in place where the interpreter's layout allows; every other shape
    # (tuples, large ints, bools, int subclasses) goes through the checked conversion, so
    # both must agree, and bad values must fail the same way wherever they sit.
    class Token(int):
        pass

    tokens = [0, 1, 255, 256, 2**30 - 1, 2**30, 2**31 + 5, 2**32 - 1, 31_999, True, Token(7)] * 3
    tokens += list(range(64 - len(tokens) % 64))
    hashes = compute_block_hash_for_seq(tokens, 16)
    assert len(hashes) == len(tokens) // 16
    assert compute_block_hash_for_seq(tuple(tokens), 16) == hashes
    assert compute_block_hash_for_seq([int(t) for t in tokens], 16) == hashes
    # A different token anywhere changes its block's hash only.
    changed = list(tokens)
    changed[40] = 2**30 + 1
    same = [a == b for a, b in zip(compute_block_hash_for_seq(changed, 16), hashes, strict=True)]
    assert same == [i != 2 for i in range(len(hashes))]
    for bad, error in [(-1, OverflowError), (2**32, OverflowError), (2**64, OverflowError), (1.5, TypeError),
                       ("7", TypeError), (None, TypeError)]:
        for at in (0, 17, len(tokens) - 1):
            with pytest.raises(error):
                compute_block_hash_for_seq([*tokens[:at], bad, *tokens[at + 1:]], 16)


def test_radix_tree_with_the_reference_json():
    tree = RadixTree()
    tree.apply_event(1, b'{"event_id": 7, "data": {"stored": {"parent_hash": null, '
                        b'"blocks": [{"block_hash": 111, "tokens_hash": 5756925433886871916}]}}}')
    scores = tree.find_matches([5756925433886871916])
    assert isinstance(scores, OverlapScores)
    assert scores.scores == {1: 1}
    tree.apply_event(1, '{"event_id": 8, "data": {"removed": {"block_hashes": [111]}}}')
    assert tree.find_matches([5756925433886871916]).scores == {}
    # Hashes are 64-bit: from a list, taken modulo 2^64; anything but ints is refused.
    tree.apply_event(1, b'{"event_id": 9, "data": {"stored": {"parent_hash": null, '
                        b'"blocks": [{"block_hash": 112, "tokens_hash": 18446744073709551615}]}}}')
    assert tree.find_matches([-1]).scores == tree.find_matches([2**64 - 1]).scores == {1: 1}
    assert tree.find_matches((2**64 - 1,)).scores == {1: 1}  # any sequence
    with pytest.raises(ValueError, match="must be an int"):
        tree.find_matches([1.5])
    tree.apply_event(1, '{"event_id": 10, "data": "cleared"}')
    assert tree.stats()["events"] == 4
    with pytest.raises(ValueError, match="invalid KV event"):
        tree.apply_event(1, b'{"event_id": 1, "data": {"stolen": {}}}')
    with pytest.raises(ValueError, match="JSON as bytes or str"):
        tree.apply_event(1, 42)


def test_radix_tree_shares_prefixes_and_tolerates_lost_events():
    h = compute_block_hash_for_seq(list(range(48)), 16)  # three blocks
    tree = RadixTree()
    tree.apply_event(1, stored(0, [(10, h[0]), (11, h[1]), (12, h[2])]))
    tree.apply_event(2, stored(0, [(20, h[0])]))
    tree.apply_event(2, stored(1, [(21, h[1])], parent=20))
    assert tree.find_matches(h).scores == {1: 3, 2: 2}
    assert tree.find_matches(h[1:]).scores == {}  # not a prefix
    # An unknown parent and a removal that overtook its store: counted, not raised.
    tree.apply_event(3, stored(0, [(30, h[1])], parent=999))
    tree.apply_event(3, '{"event_id": 1, "data": {"removed": {"block_hashes": [31]}}}')
    stats = tree.stats()
    assert (stats["unknown_parents"], stats["unknown_removals"]) == (1, 1)
    # Worker 1 loses its middle block: its match stops there.
    tree.apply_event(1, '{"event_id": 1, "data": {"removed": {"block_hashes": [11]}}}')
    assert tree.find_matches(h).scores == {1: 1, 2: 2}
    tree.remove_worker(2)
    assert tree.find_matches(h).scores == {1: 1}


def test_dump_rebuilds_the_tree():
    h = compute_block_hash_for_seq(list(range(64)), 16)
    tree = RadixTree()
    tree.apply_event(1, stored(0, [(1, h[0]), (2, h[1]), (3, h[2])]))
    tree.apply_event(2, stored(0, [(-5, h[0]), (-6, h[3])]))  # engines may use signed ids
    copy = RadixTree()
    for line in tree.dump_tree_as_events():
        event = json.loads(line)
        copy.apply_event(event["worker_id"], json.dumps(event["event"]))
    for query in (h, h[:1], [h[0], h[3]]):
        assert copy.find_matches(query).scores == tree.find_matches(query).scores
    assert copy.stats()["unknown_parents"] == 0


async def ask(client: Any, body: dict[str, Any]) -> dict[str, Any]:
    [answer] = await request(client, body, timeout=STREAM_TIMEOUT)
    return answer


async def test_publisher_to_indexer_across_processes(runtime, workers, namespace):
    component = runtime.namespace(namespace).component("engine")
    indexer = KvIndexer(component, 4)
    assert indexer.block_size() == 4
    worker = await workers.start("kv_engine_worker.py", "--namespace", namespace, "--component", "engine")
    client = await component.endpoint("generate").client()
    tokens = list(range(10))  # two full blocks of 4, and 2 tokens that are not a block
    event_id = 0

    async def publish_until(body: dict[str, Any], expected: dict[int, int], what: str) -> None:
        """Publish `body` (idempotent) every 100 ms until the indexer shows `expected`."""
        scores: dict[int, int] = {}

        async def shown() -> bool:
            nonlocal event_id, scores
            answer = await ask(client, {**body, "event_id": event_id})
            event_id += 1
            assert answer["ok"] and answer["worker_id"] == worker.instance_id
            scores = (await indexer.find_matches_for_request(tokens)).scores
            return scores == expected

        await wait_until(shown, DELIVERY_TIMEOUT, lambda: f"{what}: indexer shows {scores}, expected {expected}",
                         interval=0.1)

    wid = worker.instance_id
    await publish_until(
        {"op": "stored", "token_ids": tokens, "num_block_tokens": [4, 4, 2], "block_hashes": [100, 101, 102]},
        {wid: 2}, "stored blocks",
    )
    await publish_until({"op": "removed", "block_hashes": [101]}, {wid: 1}, "a removed block")
    await publish_until({"op": "cleared"}, {}, "a cleared cache")
    await publish_until(
        {"op": "stored", "token_ids": tokens, "num_block_tokens": [4, 4], "block_hashes": [100, 101]},
        {wid: 2}, "blocks stored again",
    )
    assert indexer.stats()["unknown_parents"] == 0

    # The worker's load reaches the component's `load_metrics` subject.
    subscription = await component.subscribe("load_metrics")
    seen: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in subscription:
            seen.append(event)

    reader = asyncio.ensure_future(read())
    try:
        await ask(client, {"op": "metrics", "kv_active_blocks": 42, "num_requests_waiting": 3})
        await wait_until(lambda: any(e.get("kv_active_blocks") == 42 for e in seen), DELIVERY_TIMEOUT,
                         lambda: f"load metrics with kv_active_blocks=42 (got {seen[-3:]})")
    finally:
        reader.cancel()
    event = next(e for e in seen if e.get("kv_active_blocks") == 42)
    assert event["worker_id"] == wid
    assert (event["num_requests_waiting"], event["kv_total_blocks"], event["request_total_slots"]) == (3, 100, 8)
    assert event["gpu_cache_usage_perc"] == pytest.approx(0.5)

    # The worker leaves discovery: its blocks leave the index. (The indexer looks at
    # discovery every second and forgets only workers it saw there: wait for a look that
    # listed it.)
    await wait_until(lambda: wid in indexer.listed_workers(), DELIVERY_TIMEOUT,
                     lambda: f"the indexer to list worker {wid} (it lists {indexer.listed_workers()})")
    worker.terminate()
    scores: dict[int, int] = {}

    async def forgotten() -> bool:
        nonlocal scores
        scores = (await indexer.find_matches_for_request(tokens)).scores
        return not scores

    await wait_until(forgotten, DELIVERY_TIMEOUT, lambda: f"the departed worker to leave the index (still {scores})",
                     interval=0.1)


async def test_publisher_rejects_bad_input(runtime, namespace):
    publisher = KvEventPublisher(runtime.namespace(namespace).component("engine"), worker_id=5, kv_block_size=4)
    assert publisher.worker_id == 5
    with pytest.raises(ValueError, match="entries"):
        publisher.publish_stored(0, [1, 2, 3, 4], [4], [1, 2])
    with pytest.raises(ValueError, match="more than"):
        publisher.publish_stored(0, [1, 2, 3], [4], [1])
    with pytest.raises(ValueError, match="64-bit"):
        publisher.publish_removed(1, [2**70])
    with pytest.raises(ValueError, match="at least 1"):
        KvEventPublisher(runtime.namespace(namespace).component("engine"), kv_block_size=0)
    assert publisher.publish_cleared(2) is True

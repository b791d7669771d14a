"""KV index benchmark through Python, with the reference's call shapes:

* ``RadixTree().apply_event(worker, json_bytes)`` for ``stored`` events of 16 blocks:
  events applied per second;
* ``find_matches(hashes).scores`` for an 8k-token request (512 blocks of 16) on a fleet
  of 8 workers holding ~10,000 blocks each, every worker sharing the request's prefix:
  p50/p99 latency;
* ``compute_block_hash_for_seq(tokens, 16)`` of 8k tokens: p50/p99 latency.

    python benches/kv_index.py                 # against the installed dynamo
    python benches/kv_index.py --json out.json

Use a release build of the extension for meaningful figures (see docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from dynamo.llm import RadixTree, compute_block_hash_for_seq

BLOCK_SIZE = 16
EVENT_BLOCKS = 16
WORKERS = 8
BLOCKS_PER_WORKER = 10_000
TOKENS_8K = 8192


def stored_events(hashes: list[int], first_id: int) -> list[bytes]:
    """JSON `stored` events of 16 blocks each, chained from the root."""
    events = []
    for i in range(0, len(hashes), EVENT_BLOCKS):
        blocks = [{"block_hash": first_id + i + j, "tokens_hash": h} for j, h in enumerate(hashes[i:i + EVENT_BLOCKS])]
        parent = first_id + i - 1 if i else None
        events.append(json.dumps({"event_id": i // EVENT_BLOCKS,
                                  "data": {"stored": {"parent_hash": parent, "blocks": blocks}}}).encode())
    return events


def percentiles(samples: list[float]) -> tuple[float, float]:
    samples = sorted(samples)
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the figures here too")
    parser.add_argument("--iterations", type=int, default=2000)
    args = parser.parse_args()
    rng = random.Random(42)

    def prompt(n: int) -> list[int]:
        return [rng.randrange(32_000) for _ in range(n)]

    # Events applied per second: 16-block stored events of 8k-token sequences, 8 workers.
    events = []
    for s in range(64):
        events.extend((s % WORKERS, e) for e in stored_events(compute_block_hash_for_seq(prompt(TOKENS_8K), BLOCK_SIZE),
                                                               s << 32))
    rates = []
    for _ in range(5):
        tree = RadixTree()
        start = time.perf_counter()
        for worker, event in events:
            tree.apply_event(worker, event)
        rates.append(len(events) / (time.perf_counter() - start))
    events_per_s = statistics.median(rates)

    # find_matches on a fleet of 8 x ~10,000 blocks, all sharing the request's 8k prefix.
    shared_tokens = prompt(TOKENS_8K)
    shared = compute_block_hash_for_seq(shared_tokens, BLOCK_SIZE)
    tree = RadixTree()
    for worker in range(WORKERS):
        held, seq = 0, 0
        while held < BLOCKS_PER_WORKER:
            hashes = shared if seq == 0 else compute_block_hash_for_seq(prompt(TOKENS_8K), BLOCK_SIZE)
            for event in stored_events(hashes, seq << 32):
                tree.apply_event(worker, event)
            held += len(hashes)
            seq += 1
    assert tree.find_matches(shared).scores == dict.fromkeys(range(WORKERS), len(shared))
    match_s = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        _ = tree.find_matches(shared).scores
        match_s.append(time.perf_counter() - start)
    match_p50, match_p99 = percentiles(match_s)

    hash_s = []
    for _ in range(args.iterations):
        start = time.perf_counter()
        compute_block_hash_for_seq(shared_tokens, BLOCK_SIZE)
        hash_s.append(time.perf_counter() - start)
    hash_p50, hash_p99 = percentiles(hash_s)

    figures = {
        "apply_event_16_blocks_per_s": round(events_per_s),
        "find_matches_8k_p50_us": round(match_p50 * 1e6, 1),
        "find_matches_8k_p99_us": round(match_p99 * 1e6, 1),
        "hash_8k_p50_us": round(hash_p50 * 1e6, 1),
        "hash_8k_p99_us": round(hash_p99 * 1e6, 1),
    }
    print(f"apply_event (16 blocks):        {figures['apply_event_16_blocks_per_s']:>10,} events/s")
    print(f"find_matches 8k tokens, 8x10k:  p50 {figures['find_matches_8k_p50_us']} us, "
          f"p99 {figures['find_matches_8k_p99_us']} us")
    print(f"compute_block_hash_for_seq 8k:  p50 {figures['hash_8k_p50_us']} us, p99 {figures['hash_8k_p99_us']} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()

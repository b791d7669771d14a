"""Test worker: an engine that publishes KV events and load metrics when asked.

Request (a dict), answered with one item `{"ok": bool, "worker_id": int}`:
  {"op": "stored", "event_id", "token_ids", "num_block_tokens", "block_hashes", "parent_hash"?}
  {"op": "removed", "event_id", "block_hashes"}
  {"op": "cleared", "event_id"}
  {"op": "metrics", "kv_active_blocks", "num_requests_waiting"}
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import KvEventPublisher, WorkerMetricsPublisher
from dynamo.runtime import DistributedRuntime, dynamo_worker
from worker_support import parse_args, serve


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args(__doc__.splitlines()[0], block_size=4)
    component = runtime.namespace(args.namespace).component(args.component)
    kv = KvEventPublisher(component, kv_block_size=args.block_size)
    metrics = WorkerMetricsPublisher(component)

    async def generate(request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        op = request["op"]
        if op == "stored":
            ok = kv.publish_stored(
                request["event_id"], request["token_ids"], request["num_block_tokens"],
                request["block_hashes"], parent_hash=request.get("parent_hash"),
            )
        elif op == "removed":
            ok = kv.publish_removed(request["event_id"], request["block_hashes"])
        elif op == "cleared":
            ok = kv.publish_cleared(request["event_id"])
        elif op == "metrics":
            metrics.publish(1, 8, request["kv_active_blocks"], 100, request["num_requests_waiting"], 0.5, 0.25)
            ok = True
        else:
            raise ValueError(f"unknown op {op!r}")
        yield {"ok": ok, "worker_id": kv.worker_id}

    await serve(runtime, args, generate)


if __name__ == "__main__":
    asyncio.run(main())

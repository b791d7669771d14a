"""Test worker: streams numbered items, optionally slowly, optionally failing.

Request (a dict; every key optional):
  count   items to stream (default 1)
  delay   seconds between items (default 0)
  tag     echoed in every item
  fail_at raise ValueError(message) before item number fail_at
  message the ValueError's message
  blob    a string: answer one item with its length instead (for payload-size tests)
Each item: {"i", "tag", "instance_id", "pid"}.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from typing import Any

from dynamo.runtime import DistributedRuntime, dynamo_worker
from worker_support import parse_args, serve


def make_handler(instance_id: int):
    async def generate(request: Any) -> AsyncIterator[dict]:
        if not isinstance(request, dict):
            request = {"count": 1, "tag": request}
        if "blob" in request:
            yield {"length": len(request["blob"]), "instance_id": instance_id}
            return
        count = int(request.get("count", 1))
        delay = float(request.get("delay", 0))
        fail_at = request.get("fail_at")
        for i in range(count + 1):
            if fail_at is not None and i == int(fail_at):
                raise ValueError(request.get("message", "the request asked to fail"))
            if i == count:
                break
            yield {"i": i, "tag": request.get("tag"), "instance_id": instance_id, "pid": os.getpid()}
            if delay:
                await asyncio.sleep(delay)

    return generate


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args(__doc__.splitlines()[0])
    await serve(runtime, args, make_handler(runtime.instance_id()))


if __name__ == "__main__":
    asyncio.run(main())

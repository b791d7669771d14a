"""Test worker: subscribes to `ping` in its namespace (or component, with --scope
component) and answers every ping with a `pong` carrying the ping and its pid."""

from __future__ import annotations

import asyncio
import os

from dynamo.runtime import DistributedRuntime, dynamo_worker
from worker_support import parse_args, report


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args(__doc__.splitlines()[0], scope="namespace")
    scope = runtime.namespace(args.namespace)
    if args.scope == "component":
        scope = scope.component(args.component)
    subscription = await scope.subscribe("ping")

    async def relay() -> None:
        async for ping in subscription:
            await scope.publish("pong", {"ping": ping, "pid": os.getpid()})

    report(f"READY {runtime.instance_id()}")
    relaying = asyncio.ensure_future(relay())
    closed = asyncio.ensure_future(runtime.closed())
    done, _ = await asyncio.wait({relaying, closed}, return_when=asyncio.FIRST_COMPLETED)
    relaying.cancel()
    closed.cancel()
    for task in done:
        if task is relaying and not task.cancelled() and task.exception():
            raise task.exception()


if __name__ == "__main__":
    asyncio.run(main())

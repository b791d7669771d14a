"""Test worker: a slow stream whose handler watches its request context and reports,
on stdout, how the stream ended:

  DONE tag=<tag> id=<context id> sent=<n> how=<completed|stopped|closed> stopped=<bool> killed=<bool>

Request: {"count", "delay", "tag", "mode"}; mode "poll" checks context.is_stopped()
before each item, mode "await" races `await context.stopped()` against the delay.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dynamo.runtime import DistributedRuntime, dynamo_worker
from worker_support import parse_args, report, serve


async def generate(request: dict, context: Any) -> AsyncIterator[dict]:
    count = int(request.get("count", 100))
    delay = float(request.get("delay", 0.02))
    mode = request.get("mode", "poll")
    sent = 0
    how = "closed"  # the generator was closed from outside (e.g. the stream was killed)
    stopped = asyncio.ensure_future(context.stopped()) if mode == "await" else None
    try:
        for i in range(count):
            if context.is_stopped():
                how = "stopped"
                break
            yield {"i": i, "id": context.id()}
            sent += 1
            if stopped is not None:
                done, _ = await asyncio.wait({stopped}, timeout=delay)
                if done:
                    how = "stopped"
                    break
            else:
                await asyncio.sleep(delay)
        else:
            how = "completed"
    finally:
        if stopped is not None:
            stopped.cancel()
        report(
            f"DONE tag={request.get('tag')} id={context.id()} sent={sent} how={how} "
            f"stopped={context.is_stopped()} killed={context.is_killed()}"
        )


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args(__doc__.splitlines()[0])
    await serve(runtime, args, generate)


if __name__ == "__main__":
    asyncio.run(main())

"""Hello-world worker: serves `hello_world.backend.generate`, streaming back the words
of the text it is sent, one at a time.

    python examples/runtime/worker.py
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from dynamo.runtime import DistributedRuntime, dynamo_worker

NAMESPACE = os.environ.get("HELLO_WORLD_NAMESPACE", "hello_world")
#: Seconds between words, so the stream is visibly a stream.
WORD_DELAY = 0.05


async def generate(request: str) -> AsyncIterator[str]:
    for word in str(request).split():
        yield word
        await asyncio.sleep(WORD_DELAY)


@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    component = runtime.namespace(NAMESPACE).component("backend")
    await component.create_service()
    endpoint = component.endpoint("generate")
    print(f"worker {runtime.instance_id()} serving {NAMESPACE}.backend.generate", flush=True)
    # Returns once the runtime has shut down (SIGINT/SIGTERM) and drained.
    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    asyncio.run(worker())

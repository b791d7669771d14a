"""Hello-world client: waits for a worker of `hello_world.backend.generate`, sends it a
sentence and prints each word that streams back.

    python examples/runtime/client.py ["some text"]
"""

from __future__ import annotations

import asyncio
import os
import sys

from dynamo.runtime import DistributedRuntime, dynamo_worker

NAMESPACE = os.environ.get("HELLO_WORLD_NAMESPACE", "hello_world")
DEFAULT_TEXT = "hello world from dynamo"
#: Seconds to wait for a worker to register.
WAIT_TIMEOUT = 30.0


async def say(runtime: DistributedRuntime, text: str) -> list[str]:
    """Send `text` to the worker; print and return the words it streams back."""
    endpoint = runtime.namespace(NAMESPACE).component("backend").endpoint("generate")
    client = await endpoint.client()
    await client.wait_for_instances(timeout=WAIT_TIMEOUT)
    words = []
    async for item in await client.generate(text):
        word = item.data()
        print(word, flush=True)
        words.append(word)
    return words


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    text = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_TEXT
    await say(runtime, text)


if __name__ == "__main__":
    asyncio.run(main())

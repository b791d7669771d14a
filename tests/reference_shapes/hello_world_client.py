import asyncio

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    await init(runtime, "dynamo")


async def init(runtime: DistributedRuntime, ns: str):
    endpoint = runtime.namespace(ns).component("backend").endpoint("generate")
    client = await endpoint.client()
    await client.wait_for_instances()
    stream = await client.generate("hello world")
    async for char in stream:
        print(char)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

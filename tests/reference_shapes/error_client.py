import asyncio

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    client = await runtime.namespace("dynamo").component("error").endpoint("generate").client()
    await client.wait_for_instances()
    errors = 0
    try:
        stream = await client.generate("hello world")
        async for char in stream:
            print(char.data())
    except ValueError as e:
        errors += 1
        print(f"caught: {e}")
    stream = await client.generate("hello", annotated=False)
    async for char in stream:
        print(char)
    print(f"errors: {errors}")


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

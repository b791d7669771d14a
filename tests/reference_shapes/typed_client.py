import asyncio

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker
from pydantic import BaseModel


class Request(BaseModel):
    data: str


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    client = await runtime.namespace("dynamo").component("typed").endpoint("generate").client()
    await client.wait_for_instances()
    stream = await client.generate(Request(data="hey").model_dump_json())
    async for item in stream:
        print(item.data())


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

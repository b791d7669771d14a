import asyncio

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker


async def generate(request):
    for char in request:
        if char == "w":
            raise ValueError("w is not allowed")
        yield char


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    component = runtime.namespace("dynamo").component("error")
    await component.create_service()
    endpoint = component.endpoint("generate")
    print("Started server instance", flush=True)
    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

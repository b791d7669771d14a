import asyncio

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_endpoint, dynamo_worker
from pydantic import BaseModel


class Request(BaseModel):
    data: str


class Response(BaseModel):
    char: str


@dynamo_endpoint(Request, Response)
async def generate(request):
    for char in request.data:
        yield Response(char=char).model_dump_json()


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    component = runtime.namespace("dynamo").component("typed")
    await component.create_service()
    endpoint = component.endpoint("generate")
    print("Started server instance", flush=True)
    await endpoint.serve_endpoint(generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

import asyncio

import uvloop
from dynamo.llm import ModelType, register_llm
from dynamo.runtime import DistributedRuntime, dynamo_worker


class RequestHandler:
    async def generate(self, request):
        for token in request["token_ids"][:4]:
            yield {"token_ids": [token]}
        yield {"token_ids": [], "finish_reason": "stop"}


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    component = runtime.namespace("dynamo").component("backend")
    await component.create_service()
    endpoint = component.endpoint("generate")
    await register_llm(ModelType.Backend, endpoint, None, "reference-model")
    print("Started server instance", flush=True)
    await endpoint.serve_endpoint(RequestHandler().generate)


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

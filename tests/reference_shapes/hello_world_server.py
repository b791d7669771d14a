import asyncio
import signal

import uvloop
from dynamo.runtime import DistributedRuntime, dynamo_worker


async def graceful_shutdown(runtime):
    print("Received shutdown signal, shutting down DistributedRuntime")
    runtime.shutdown()
    print("DistributedRuntime shutdown complete")


@dynamo_worker(static=False)
async def worker(runtime: DistributedRuntime):
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.create_task(graceful_shutdown(runtime)))
    await init(runtime, "dynamo")


async def init(runtime: DistributedRuntime, ns: str):
    component = runtime.namespace(ns).component("backend")
    await component.create_service()
    endpoint = component.endpoint("generate")
    print("Started server instance", flush=True)
    await endpoint.serve_endpoint(generate)


async def generate(request):
    for char in request:
        await asyncio.sleep(0.05)
        yield char


if __name__ == "__main__":
    uvloop.install()
    asyncio.run(worker())

"""Interfaces and ``.link()``: a Frontend depends on a *RouterInterface*, routers depend
on a *WorkerInterface*; the module picks the implementations at the bottom.

    cd examples/llm_hello_world
    dynamo serve llm_hello_world:Frontend
    curl -N -X POST localhost:8000/generate -H 'Content-Type: application/json' -d '{"text": "hello world"}'

Only the linked path is started: Frontend → FastRouter → SpongeWorker. Swap the last
line to ``Frontend.link(SlowRouter).link(ShoutWorker)`` to run the other pair.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

from dynamo.sdk import AbstractService, abstract_endpoint, api, depends, endpoint, service
from pydantic import BaseModel

NAMESPACE = {"namespace": "llm-hello-world"}


class ChatRequest(BaseModel):
    text: str


class WorkerInterface(AbstractService):
    """What a worker must serve."""

    @abstract_endpoint
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        yield ""


class RouterInterface(AbstractService):
    """What a router must serve."""

    @abstract_endpoint
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        yield ""


@service(dynamo=NAMESPACE)
class SpongeWorker(WorkerInterface):
    """Randomly capitalises each letter."""

    @endpoint()
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        for word in request.text.split():
            yield "".join(c.upper() if random.random() < 0.5 else c.lower() for c in word)


@service(dynamo=NAMESPACE)
class ShoutWorker(WorkerInterface):
    """Upper-cases every word."""

    @endpoint()
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        for word in request.text.split():
            yield word.upper()


@service(dynamo=NAMESPACE)
class FastRouter(RouterInterface):
    worker = depends(WorkerInterface)

    @endpoint()
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        await asyncio.sleep(0.01)
        async for word in self.worker.generate(request):
            yield word


@service(dynamo=NAMESPACE)
class SlowRouter(RouterInterface):
    worker = depends(WorkerInterface)

    @endpoint()
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        await asyncio.sleep(1.0)
        async for word in self.worker.generate(request):
            yield word


@service(dynamo=NAMESPACE)
class Frontend:
    router = depends(RouterInterface)

    @api()
    async def generate(self, request: ChatRequest) -> AsyncIterator[str]:
        async for word in self.router.generate(request):
            yield f"data: {word}\n\n"


Frontend.link(FastRouter).link(SpongeWorker)

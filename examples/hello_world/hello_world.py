"""Hello world as a service graph: an HTTP Frontend → Middle → Backend.

    cd examples/hello_world
    dynamo serve hello_world:Frontend -f config.yaml
    curl -N -X POST localhost:8000/generate -H 'Content-Type: application/json' -d '{"text": "hello"}'

Each service appends its configured ``message`` to the text; the Backend streams the
words back and each hop prefixes its name.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from dynamo.sdk import api, async_on_shutdown, depends, endpoint, liveness, readiness, service
from pydantic import BaseModel


class RequestType(BaseModel):
    text: str


@service(dynamo={"namespace": "inference"}, workers=2)
class Backend:
    def __init__(self, message: str = "back") -> None:
        self.message = message

    @endpoint()
    async def generate(self, request: RequestType) -> AsyncIterator[str]:
        text = f"{request.text}-{self.message}"
        for word in text.split():
            yield f"Backend: {word}"


@service(dynamo={"namespace": "inference"})
class Middle:
    backend = depends(Backend)

    def __init__(self, message: str = "mid") -> None:
        self.message = message

    @endpoint()
    async def generate(self, request: RequestType) -> AsyncIterator[str]:
        forwarded = RequestType(text=f"{request.text}-{self.message}")
        async for item in self.backend.generate(forwarded):
            yield f"Middle: {item}"


@service(dynamo={"namespace": "inference"})
class Frontend:
    middle = depends(Middle)

    def __init__(self, message: str = "front") -> None:
        self.message = message

    @api()
    async def generate(self, request: RequestType) -> AsyncIterator[str]:
        """POST /generate: streams one line per word."""
        forwarded = RequestType(text=f"{request.text}-{self.message}")
        async for item in self.middle.generate(forwarded):
            yield f"Frontend: {item}\n"

    @liveness
    def alive(self) -> bool:
        return True

    @readiness
    async def ready(self) -> bool:
        return True

    @async_on_shutdown
    async def goodbye(self) -> None:
        print("Frontend: shut down cleanly", flush=True)

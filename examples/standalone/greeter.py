"""An SDK service that depends on the standalone ``worker.py`` component.

    python greeter.py                           # alone (the worker must run too)
    dynamo serve greeter:Greeter -f config.yaml # both, each as its own process
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from dynamo.sdk import depends, endpoint, run_component, service
from worker import Worker


@service(dynamo={"namespace": "standalone"})
class Greeter:
    worker = depends(Worker)

    def __init__(self, greeting: str = "hello") -> None:
        self.greeting = greeting

    @endpoint()
    async def generate(self, name: str) -> AsyncIterator[str]:
        async for item in self.worker.generate({"text": f"{self.greeting} {name}"}):
            yield item


if __name__ == "__main__":
    run_component(Greeter)

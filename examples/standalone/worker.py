"""A component written directly against the runtime, with its own ``main`` (design
proposal 002). Deployment facts live in a plain ``BaseDeployment`` class; arguments come
from one parser that reads the same configuration alone or under ``dynamo serve``.

    python worker.py --suffix '!'             # alone
    python worker.py -f config.yaml           # alone, configured from the YAML file
    dynamo serve greeter:Greeter -f config.yaml   # started by serve as `python -m worker`
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from dynamo.runtime import DistributedRuntime, dynamo_worker
from dynamo.sdk import BaseDeployment, DynamoArgumentParser


class Worker(BaseDeployment):
    namespace = "standalone"
    resources = {"cpu": "1"}
    endpoints = ["generate"]


class EchoHandler:
    def __init__(self, suffix: str, repeat: int) -> None:
        self.suffix = suffix
        self.repeat = repeat

    async def generate(self, request: dict) -> AsyncIterator[str]:
        for _ in range(self.repeat):
            yield f"{request['text']}{self.suffix}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = DynamoArgumentParser(Worker.name, description="echo worker")
    parser.add_argument("--suffix", default="!")
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args(argv)

    @dynamo_worker()
    async def worker(runtime: DistributedRuntime) -> None:
        deploy = Worker()
        component = runtime.namespace(deploy.namespace).component(deploy.name)
        await component.create_service()
        endpoint = component.endpoint("generate")
        print(f"{deploy.name} ready in {deploy.namespace}", flush=True)
        await endpoint.serve_endpoint(EchoHandler(args.suffix, args.repeat).generate)

    asyncio.run(worker())


if __name__ == "__main__":
    main()

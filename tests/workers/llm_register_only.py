"""Test worker: registers a `backend` model (built-in card) on an endpoint it never
serves, then waits for shutdown, so frontends see a model entry with no instance behind
it. Prints `READY <instance_id>` once registered."""

from __future__ import annotations

import asyncio

from dynamo.llm import register_llm
from dynamo.runtime import DistributedRuntime, dynamo_worker
from worker_support import parse_args, report


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args("register a model without serving its endpoint", model_name="orphan")
    endpoint = runtime.namespace(args.namespace).component(args.component).endpoint(args.endpoint)
    await register_llm(endpoint, model_name=args.model_name)
    report(f"READY {runtime.instance_id()}")
    await runtime.closed()


if __name__ == "__main__":
    asyncio.run(main())

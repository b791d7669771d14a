"""A token-level worker that misbehaves on purpose, for the fault suite.

    python bad_worker.py --endpoint ns.bad.generate --model-path DIR --mode MODE

Modes: `hang` (never yields), `stall` (yields one token, then nothing), `raise` (yields
two tokens, then raises), `truncate` (yields two tokens and ends without a finish
reason). Prints `READY <instance id>` once registered.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import ModelType, register_llm
from dynamo.runtime import DistributedRuntime, dynamo_worker


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--mode", choices=["hang", "stall", "raise", "truncate"], required=True)
    return parser.parse_args()


def make_handler(mode: str) -> Any:
    async def generate(request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        token = 5  # a word of the test vocabulary, so that it becomes a chunk of text
        if mode == "hang":
            await asyncio.Event().wait()
        yield {"token_ids": [token]}
        if mode == "stall":
            await asyncio.Event().wait()
        yield {"token_ids": [token]}
        if mode == "raise":
            raise RuntimeError("the engine crashed mid-stream")
        # truncate: end without a finish reason

    return generate


@dynamo_worker()
async def worker(runtime: DistributedRuntime, args: argparse.Namespace) -> None:
    namespace, component, name = args.endpoint.split(".")
    endpoint = runtime.namespace(namespace).component(component).endpoint(name)
    serving = asyncio.create_task(endpoint.serve_endpoint(make_handler(args.mode)))
    await register_llm(endpoint, model_path=args.model_path, kind=ModelType.Backend)
    print(f"READY {runtime.instance_id()}", flush=True)
    await serving


if __name__ == "__main__":
    asyncio.run(worker(parse_args()))

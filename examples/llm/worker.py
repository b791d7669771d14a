"""A token-level LLM worker in Python: it echoes the prompt's tokens back one at a time,
and registers itself (with the built-in model card) so that an OpenAI frontend serves it.

    python examples/llm/worker.py --model-name echo-py &
    dynamo-run in=http out=dyn --http-port 8080

The frontend tokenizes the request with the model card, sends the worker a
PreprocessedRequest dict (``token_ids``, ``stop_conditions``, ``sampling_options``,
``eos_token_ids``) and detokenizes what it yields (``{"token_ids": [...]}``, the last
item with ``"finish_reason"``), applying stop strings itself.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import ModelType, register_llm
from dynamo.runtime import DistributedRuntime, RequestContext, dynamo_worker

#: Tokens generated when the request sets no max_tokens.
DEFAULT_MAX_TOKENS = 512


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Serve a token-level echo engine written in Python.")
    parser.add_argument("--endpoint", default="dynamo.echo_py.generate", help="namespace.component.endpoint")
    parser.add_argument("--model-name", default="echo-py", help="the model name clients use")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="pause between tokens (ms)")
    return parser.parse_args()


def make_handler(delay: float) -> Any:
    async def generate(request: dict[str, Any], context: RequestContext) -> AsyncIterator[dict[str, Any]]:
        stop = request.get("stop_conditions") or {}
        max_tokens = stop.get("max_tokens") or DEFAULT_MAX_TOKENS
        prompt: list[int] = request["token_ids"]
        for generated, token in enumerate(prompt, start=1):
            if context.is_stopped():
                yield {"token_ids": [], "finish_reason": "cancelled"}
                return
            if generated == max_tokens:
                yield {"token_ids": [token], "finish_reason": "length"}
                return
            yield {"token_ids": [token]}
            if delay:
                await asyncio.sleep(delay)
        yield {"token_ids": [], "finish_reason": "stop"}

    return generate


@dynamo_worker()
async def worker(runtime: DistributedRuntime, args: argparse.Namespace) -> None:
    namespace, component, name = args.endpoint.removeprefix("dyn://").split(".")
    endpoint = runtime.namespace(namespace).component(component).endpoint(name)
    # Serve first, then register: frontends list the model once the endpoint has an
    # instance, so registering right after starting to serve loses no request.
    serving = asyncio.create_task(endpoint.serve_endpoint(make_handler(args.delay_ms / 1000)))
    await register_llm(endpoint, model_name=args.model_name, kind=ModelType.Backend)
    print(f"serving model '{args.model_name}' on dyn://{args.endpoint} (instance {runtime.instance_id()})", flush=True)
    # Returns once SIGINT/SIGTERM has shut the runtime down and in-flight streams drained.
    await serving


if __name__ == "__main__":
    asyncio.run(worker(parse_args()))

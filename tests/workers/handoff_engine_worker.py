"""Test worker: a pure-Python token-level engine in a disaggregated role, behind the
same interface as the vLLM worker (dynamo.llm.disagg), registered as a backend model.

- prefill: ``prefill`` waits ``--prefill-delay`` seconds, then returns transfer
  parameters describing the prompt (nested JSON of every kind); prints
  ``PREFILLING <request id>`` when it starts, ``PARAMS <request id> <json>`` when done;
  raises for a prompt holding ``w900``; prints ``CANCELLED <request id>`` when the job
  is given up while it waits.
- decode/agg: ``generate`` yields ``max_tokens`` tokens (``w3`` …); prints
  ``RECEIVED <request id> <json of the descriptor's engine_params>`` for a remote prefill
  and ``LOCAL <request id>`` otherwise, and publishes KV events for the prompt's blocks,
  now cached (the decode role's rule reads them back through ``own_cached_tokens``,
  printing ``CACHED <tokens>`` for each prompt).

Prints ``READY <instance id>`` once serving.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import KvEventPublisher, register_llm
from dynamo.llm.disagg import add_arguments, connect_decode, decode_handler, own_cached_tokens, serve_prefill
from dynamo.runtime import DistributedRuntime, RequestContext, dynamo_worker

BLOCK_SIZE = 16
FIRST_WORD_TOKEN = 3
#: A prompt holding this token (the word ``w900``) fails to prefill.
FAILING_TOKEN = 900


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--prefill-delay", type=float, default=0.0)
    add_arguments(parser)
    return parser.parse_args()


def transfer_params(token_ids: list[int]) -> dict[str, Any]:
    """What this engine's prefill hands to the decode side: opaque to Dynamo."""
    return {
        "digest": hashlib.sha256(json.dumps(token_ids).encode()).hexdigest(),
        "remote_block_ids": [[i, i + 1] for i in range(0, len(token_ids) // BLOCK_SIZE, 2)],
        "remote_host": "127.0.0.1",
        "remote_port": 5600,
        "pid": os.getpid(),
        "do_remote_prefill": True,
        "ratio": 0.25,
        "nothing": None,
        "nested": {"unicode": "préfill ✓", "empty": [], "deep": {"x": [1, "two", 3.5, False]}},
    }


async def prefill(request: dict[str, Any], context: RequestContext) -> dict[str, Any]:
    assert request["stop_conditions"]["max_tokens"] == 1, request
    print(f"PREFILLING {context.id()}", flush=True)
    if FAILING_TOKEN in request["token_ids"]:
        raise RuntimeError("this engine refuses prompts with w900")
    try:
        await asyncio.sleep(ARGS.prefill_delay)
    except asyncio.CancelledError:
        print(f"CANCELLED {context.id()}", flush=True)
        raise
    params = transfer_params(request["token_ids"])
    print(f"PARAMS {context.id()} {json.dumps(params, sort_keys=True)}", flush=True)
    return params


class PromptCache:
    """The engine's cache as KV events: every full block of each prompt, stored once."""

    def __init__(self, publisher: KvEventPublisher) -> None:
        self.publisher = publisher
        self.event_id = 0
        self.blocks: dict[tuple[int, ...], int] = {}
        # An empty cache to start with; this also makes the publisher known to
        # subscribers before the first prompt (events published before a subscriber
        # connects are not delivered to it).
        publisher.publish_cleared(self.event_id)

    def __call__(self, token_ids: list[int]) -> None:
        full = len(token_ids) // BLOCK_SIZE * BLOCK_SIZE
        prefixes = [tuple(token_ids[: end]) for end in range(BLOCK_SIZE, full + 1, BLOCK_SIZE)]
        new = [i for i, prefix in enumerate(prefixes) if prefix not in self.blocks]
        if not new:
            return
        first = new[0]
        for i in new:
            self.blocks[prefixes[i]] = len(self.blocks) + 1
        self.event_id += 1
        self.publisher.publish_stored(
            self.event_id, token_ids[first * BLOCK_SIZE: full], [BLOCK_SIZE] * len(new),
            [self.blocks[prefixes[i]] for i in new], parent_hash=self.blocks[prefixes[first - 1]] if first else None,
        )


def cache_prompt(token_ids: list[int]) -> None:
    if CACHE is not None:
        CACHE(token_ids)


CACHE: PromptCache | None = None


async def generate(
    request: dict[str, Any], context: RequestContext, transfer: dict[str, Any] | None
) -> AsyncIterator[dict[str, Any]]:
    if transfer is None:
        print(f"LOCAL {context.id()}", flush=True)
    else:
        expected = transfer_params(request["token_ids"])["digest"]
        if transfer["engine_params"]["digest"] != expected or transfer["prompt_tokens"] != len(request["token_ids"]):
            yield {"token_ids": [], "finish_reason": {"error": "the descriptor describes another prompt"}}
            return
        print(f"RECEIVED {context.id()} {json.dumps(transfer['engine_params'], sort_keys=True)}", flush=True)
    cache_prompt(request["token_ids"])
    max_tokens = (request.get("stop_conditions") or {}).get("max_tokens") or 4
    for i in range(max_tokens):
        last = i == max_tokens - 1
        yield {"token_ids": [FIRST_WORD_TOKEN + i], **({"finish_reason": "length"} if last else {})}


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    namespace, component_name, name = ARGS.endpoint.removeprefix("dyn://").split(".")
    component = runtime.namespace(namespace).component(component_name)
    await component.create_service()
    endpoint = component.endpoint(name)
    if ARGS.role == "prefill":
        ready = lambda: print(f"READY {runtime.instance_id()}", flush=True)  # noqa: E731
        await serve_prefill(runtime, endpoint, prefill, BLOCK_SIZE, ARGS.max_concurrent_prefills, on_ready=ready)
        return
    global CACHE
    CACHE = PromptCache(KvEventPublisher(component, kv_block_size=BLOCK_SIZE))
    if ARGS.role == "decode":
        remote = await connect_decode(endpoint, ARGS)
        own_cache = own_cached_tokens(component, BLOCK_SIZE, runtime.instance_id())

        async def cached_tokens(token_ids: list[int]) -> int:
            cached = await own_cache(token_ids)
            print(f"CACHED {cached}", flush=True)
            return cached

        handler = decode_handler(remote, generate, cached_tokens)
        print(f"TRANSPORT {remote.transport}", flush=True)
    else:
        async def handler(request: dict[str, Any], context: RequestContext) -> AsyncIterator[dict[str, Any]]:
            async for item in generate(request, context, None):
                yield item

    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    await register_llm(endpoint, model_path=ARGS.model_path, kind="backend", kv_cache_block_size=BLOCK_SIZE)
    print(f"READY {runtime.instance_id()}", flush=True)
    await serving


ARGS = parse_args() if __name__ == "__main__" else argparse.Namespace()

if __name__ == "__main__":
    asyncio.run(main())

"""Disaggregated serving for a Python token-level engine (docs/disagg.md). The decode
role wraps the engine's ``generate`` in the core's remote-prefill step; the prefill role
serves the engine's ``prefill`` function. The decision rule, the prefill queue, the
bounds and the counters are the core's (``RemotePrefill``, ``serve_prefill_worker``):
this module only wires an engine to them and declares their command-line flags.

An engine provides two coroutines::

    async def prefill(request: dict, context: RequestContext) -> dict | None:
        # compute the prompt (request["token_ids"]); return the engine's transfer parameters

    async def generate(request: dict, context: RequestContext, transfer: dict | None) -> AsyncIterator[dict]:
        # transfer: the prefill worker's descriptor (its "engine_params" are what
        # prefill returned there), or None to prefill locally
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dynamo._core import Component, Endpoint, KvIndexer, RemotePrefill, RequestContext, serve_prefill_worker

ROLES = ("agg", "prefill", "decode")

#: ``prefill(request, context)``: the engine's transfer parameters for a computed prompt.
PrefillFunction = Callable[[dict[str, Any], RequestContext], Awaitable[dict[str, Any] | None]]
#: ``cached_tokens(token_ids)``: how many leading tokens of a prompt the engine has cached.
CachedTokens = Callable[[list[int]], Awaitable[int]]
#: ``generate(request, context, transfer)``: the engine's output items.
GenerateFunction = Callable[[dict[str, Any], RequestContext, dict[str, Any] | None], AsyncIterator[dict[str, Any]]]


def add_arguments(parser: argparse.ArgumentParser | Any, defaults: bool = True) -> None:
    """Add the disaggregation flags (``--role`` and the thresholds) to ``parser`` or an
    argument group; ``defaults=False`` leaves the thresholds ``None`` unless given (for
    a caller that passes only given flags on, as ``python -m dynamo.mocker`` does)."""

    def default(value: object) -> object:
        return value if defaults else None

    parser.add_argument(
        "--role", choices=ROLES, default="agg",
        help="agg: prefill and decode here (default); prefill: take prefill jobs, register no model; "
        "decode: serve the model, send long prefills to prefill workers",
    )
    parser.add_argument(
        "--prefill-endpoint", help="decode: the prefill workers' endpoint (default NAMESPACE.prefill.generate)"
    )
    parser.add_argument(
        "--max-local-prefill-length", type=int, default=default(1000),
        help="decode: prefill remotely only when the prompt's uncached part is longer than this (tokens; default 1000)",
    )
    parser.add_argument(
        "--max-prefill-queue-size", type=int, default=default(2),
        help="decode: ...and fewer than this many prefill jobs wait (default 2; 0 never sends)",
    )
    parser.add_argument(
        "--remote-prefill-timeout", type=float, default=default(30.0),
        help="decode: seconds a remote prefill may take before prefilling locally (default 30)",
    )
    parser.add_argument(
        "--max-concurrent-prefills", type=int, default=default(2), help="prefill: jobs computed at once (default 2)"
    )


async def connect_decode(endpoint: Endpoint, args: Any) -> RemotePrefill:
    """The decode side's connection to the prefill queue, per the flags of
    :func:`add_arguments` (``args``: their parsed namespace, or an object with the same
    attributes)."""
    prefill_endpoint = args.prefill_endpoint.removeprefix("dyn://") if args.prefill_endpoint else None
    return await RemotePrefill.connect(
        endpoint,
        prefill_endpoint=prefill_endpoint,
        max_local_prefill_length=args.max_local_prefill_length,
        max_prefill_queue_size=args.max_prefill_queue_size,
        remote_prefill_timeout=args.remote_prefill_timeout,
    )


def own_cached_tokens(component: Component, block_size: int, worker_id: int) -> CachedTokens:
    """``cached_tokens`` for an engine that publishes KV events on ``component`` as
    ``worker_id``: its cached prefix of a prompt as a KV router sees it (a ``KvIndexer``
    following the component's events), in tokens. For engines with no query of their
    own prefix cache (vLLM); the view lags the engine by the events in flight."""
    indexer = KvIndexer(component, block_size)

    async def cached_tokens(token_ids: list[int]) -> int:
        matches = await indexer.find_matches_for_request(token_ids)
        return matches.scores.get(worker_id, 0) * block_size

    return cached_tokens


def decode_handler(
    remote: RemotePrefill, generate: GenerateFunction, cached_tokens: CachedTokens | None = None
) -> Callable[[dict[str, Any], RequestContext], AsyncIterator[dict[str, Any]]]:
    """The endpoint handler of a decode worker: the core decides where the prompt is
    prefilled (``cached_tokens``: how much of it the engine has cached, default none)
    and waits for a remote prefill; then the engine generates with the descriptor, or
    with ``None`` to prefill locally. A request without valid token ids goes straight to
    the engine, which reports it."""

    async def handler(request: dict[str, Any], context: RequestContext) -> AsyncIterator[dict[str, Any]]:
        transfer = None
        token_ids = request.get("token_ids") if isinstance(request, dict) else None
        if isinstance(token_ids, list) and token_ids:
            try:
                cached = await cached_tokens(token_ids) if cached_tokens is not None else 0
                transfer = await remote.prefill(token_ids, context, cached)
            except (TypeError, OverflowError):
                transfer = None  # not token ids: the engine's validation answers
        async for item in generate(request, context, transfer):
            yield item

    return handler


async def serve_prefill(
    runtime: Any,
    endpoint: Endpoint,
    prefill: PrefillFunction,
    block_size: int,
    max_concurrent_prefills: int,
    on_ready: Callable[[], None] | None = None,
) -> None:
    """Serve prefill jobs on ``endpoint`` with ``prefill`` until the runtime shuts down;
    ``on_ready`` is called once decode workers can discover the endpoint."""
    worker = await serve_prefill_worker(
        endpoint, prefill, block_size=block_size, max_concurrent_prefills=max_concurrent_prefills
    )
    if on_ready is not None:
        on_ready()
    try:
        await runtime.closed()
    finally:
        await worker.shutdown()

"""``python -m dynamo.router``: a standalone KV router component. It follows the KV events
and load metrics of the workers at ``--workers`` and serves ``--endpoint`` (default
``dyn://dynamo.router.generate``): each request ``{"token_ids": [...]}`` is answered with
one item ``{"worker_id": N, "overlap_blocks": K}``, the instance to send the prompt to and
the leading blocks of it that instance holds. A Python processor calls it, then sends the
request to that instance (``client.direct(request, worker_id)``). See docs/kv-routing.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

from dynamo.llm import KvRouter
from dynamo.runtime import DistributedRuntime, Endpoint, RequestContext, dynamo_worker

DEFAULT_ENDPOINT = "dyn://dynamo.router.generate"


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.router``."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo.router",
        description="Serve KV-cache-aware routing decisions for the workers of an endpoint.",
    )
    parser.add_argument("--workers", required=True, help="the workers' endpoint, dyn://namespace.component.endpoint")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"where to serve (default {DEFAULT_ENDPOINT})")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block of the workers (default 16)")
    parser.add_argument("--kv-overlap-weight", type=float, default=8.0, help="weight of a block to prefill (default 8)")
    parser.add_argument("--router-temperature", type=float, default=0.0, help="softmax temperature (default 0)")
    parser.add_argument("--busy-threshold", type=float, help="KV usage fraction at which a worker is busy")
    events = parser.add_mutually_exclusive_group()
    events.add_argument("--kv-events", dest="kv_events", action="store_true", default=True,
                        help="follow the workers' KV events (default)")
    events.add_argument("--no-kv-events", dest="kv_events", action="store_false",
                        help="approximate: predict caches from the router's own choices")
    parser.add_argument("--router-replica-sync", action=argparse.BooleanOptionalAction, default=True,
                        help="share choices with the other routers (and frontends) of the same workers (default)")
    return parser.parse_args(argv)


def endpoint_of(runtime: DistributedRuntime, path: str) -> Endpoint:
    """The endpoint named ``dyn://namespace.component.endpoint`` (or without ``dyn://``)."""
    parts = path.removeprefix("dyn://").split(".")
    if len(parts) != 3 or not all(parts):
        raise SystemExit(f"python -m dynamo.router: '{path}' is not dyn://namespace.component.endpoint")
    namespace, component, name = parts
    return runtime.namespace(namespace).component(component).endpoint(name)


def make_handler(router: KvRouter) -> Any:
    async def generate(request: dict[str, Any], context: RequestContext) -> AsyncIterator[dict[str, Any]]:
        token_ids = request.get("token_ids") if isinstance(request, dict) else None
        if not isinstance(token_ids, list):
            raise ValueError('expected {"token_ids": [int, ...]}')
        worker_id, overlap = await router.best_worker(token_ids)
        yield {"worker_id": worker_id, "overlap_blocks": overlap}

    return generate


@dynamo_worker()
async def serve(runtime: DistributedRuntime, args: argparse.Namespace) -> None:
    workers = endpoint_of(runtime, args.workers)
    served = endpoint_of(runtime, args.endpoint)
    router = KvRouter(
        workers, block_size=args.block_size, overlap_weight=args.kv_overlap_weight,
        temperature=args.router_temperature, busy_threshold=args.busy_threshold, use_kv_events=args.kv_events,
        replica_sync=args.router_replica_sync,
    )
    serving = asyncio.create_task(served.serve_endpoint(make_handler(router)))
    print(f"routing for {args.workers} on {args.endpoint} (instance {runtime.instance_id()})", flush=True)
    await serving


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        asyncio.run(serve(args))
    except ValueError as e:
        print(f"python -m dynamo.router: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

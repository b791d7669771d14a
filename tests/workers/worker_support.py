"""What every test worker does: serve one endpoint, announce `READY <instance_id>` on
stdout once its own instance is visible through discovery, and return when the runtime
has drained (serve_endpoint returns after shutdown)."""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from typing import Any

#: Bound on the worker seeing its own registration.
REGISTER_TIMEOUT = 20.0


def parse_args(description: str, **extra: Any) -> argparse.Namespace:
    """`--namespace` (required), `--component`, `--endpoint`, plus `extra` options (name -> default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--component", default="backend")
    parser.add_argument("--endpoint", default="generate")
    for name, default in extra.items():
        kind = type(default) if default is not None else str
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default=default, type=kind)
    return parser.parse_args()


def report(line: str) -> None:
    """A line the test reads."""
    print(line, flush=True)


async def serve(runtime: Any, args: argparse.Namespace, handler: Callable[..., Any]) -> None:
    """Serve `handler` on namespace.component.endpoint; print READY once registered."""
    component = runtime.namespace(args.namespace).component(args.component)
    await component.create_service()
    endpoint = component.endpoint(args.endpoint)
    serving = asyncio.ensure_future(endpoint.serve_endpoint(handler))
    client = await endpoint.client()
    me = runtime.instance_id()
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while me not in client.instance_ids():
        if serving.done():
            serving.result()  # raises what serve_endpoint raised
            raise RuntimeError("serve_endpoint returned before the instance registered")
        if time.monotonic() > deadline:
            raise RuntimeError(f"instance {me} did not appear in discovery within {REGISTER_TIMEOUT}s")
        await asyncio.sleep(0.02)
    report(f"READY {me}")
    await serving
    report("SERVED")

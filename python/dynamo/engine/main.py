"""``python -m dynamo.<engine>``: check the engine is installed, parse the command line,
let the adapter finish the engine's configuration, and serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from collections.abc import Sequence
from functools import partial

from dynamo.engine.adapter import EngineAdapter
from dynamo.supervisor import free_port


def engine_missing(adapter: EngineAdapter) -> str | None:
    """Why the engine cannot be imported, or ``None`` when it can."""
    try:
        if importlib.util.find_spec(adapter.package) is None:
            return f"No module named {adapter.package!r}"
        __import__(adapter.package)
    except ImportError as e:
        return str(e)
    return None


def main(adapter: EngineAdapter, argv: Sequence[str] | None, prog: str) -> int:
    """Serve ``adapter``'s engine; returns the exit status (2: not installed, or a usage
    error)."""
    missing = engine_missing(adapter)
    if missing is not None:
        print(
            f"{prog} needs the {adapter.package} package ({missing}); install it with: {adapter.install_hint}",
            file=sys.stderr,
        )
        return 2
    from dynamo.engine.config import parse_args

    config = parse_args(adapter, sys.argv[1:] if argv is None else argv, prog)
    # Engines' ZMQ event publishers and transfer side channels bind every interface.
    adapter.configure(config, partial(free_port, ""))

    from dynamo.engine.serve import serve
    from dynamo.runtime import DistributedRuntime, dynamo_worker

    @dynamo_worker()
    async def worker(runtime: DistributedRuntime) -> None:
        await serve(runtime, config, adapter)

    asyncio.run(worker())
    return 0

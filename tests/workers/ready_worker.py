"""Test worker that holds its readiness mark: it serves stream_worker's handler, prints
`READY <instance_id>` once registered while `/ready` still says 503, and gives the mark
once the file named by `--mark-file` exists, printing `runtime.not_ready()` before and
after (`MARKED <before> <after>`)."""

from __future__ import annotations

import asyncio
import os

from dynamo.runtime import DistributedRuntime, dynamo_worker
from stream_worker import make_handler
from worker_support import parse_args, report, serve


async def give_mark_when(runtime: DistributedRuntime, path: str) -> None:
    while not os.path.exists(path):
        await asyncio.sleep(0.02)
    before = runtime.not_ready()
    runtime.set_ready(True)
    report(f"MARKED {before} {runtime.not_ready()}")


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    args = parse_args(__doc__.splitlines()[0], mark_file="")
    runtime.set_ready(False)
    marker = asyncio.ensure_future(give_mark_when(runtime, args.mark_file))
    try:
        await serve(runtime, args, make_handler(runtime.instance_id()))
    finally:
        marker.cancel()


if __name__ == "__main__":
    asyncio.run(main())

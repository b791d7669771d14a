"""``python -m dynamo.vllm``: serve a vLLM engine as a Dynamo token-level worker.

    python -m dynamo.vllm --model Qwen/Qwen3-0.6B --enforce-eager
    python -m dynamo.vllm --model /models/llama --tensor-parallel-size 2 --endpoint dyn://dynamo.vllm.generate
    python -m dynamo.vllm --model /models/llama --role prefill --endpoint dyn://dynamo.prefill.generate
    python -m dynamo.vllm --model /models/llama --role decode --endpoint dyn://dynamo.backend.generate

vLLM's own flags are accepted as ``vllm serve`` takes them; ``--help`` lists Dynamo's in
their own group.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import Sequence

from .args import Config, parse_args


def free_port() -> int:
    """A TCP port free on every interface right now (vLLM's ZMQ event publisher and
    its NIXL side channel bind every interface)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:
        print(f"python -m dynamo.vllm needs the vllm package ({e}); install it with: pip install vllm", file=sys.stderr)
        return 2
    config: Config = parse_args(sys.argv[1:] if argv is None else argv)

    from dynamo.runtime import DistributedRuntime, dynamo_worker

    from .worker import configure_disagg, configure_kv_events, serve

    configure_kv_events(config, config.kv_events_port or free_port())
    configure_disagg(config, free_port() if config.role != "agg" else None)

    @dynamo_worker()
    async def worker(runtime: DistributedRuntime) -> None:
        await serve(runtime, config)

    asyncio.run(worker())
    return 0


if __name__ == "__main__":
    sys.exit(main())

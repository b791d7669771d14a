"""``python -m dynamo.vllm``: serve a vLLM engine as a Dynamo token-level worker.

    python -m dynamo.vllm --model Qwen/Qwen3-0.6B --enforce-eager
    python -m dynamo.vllm --model /models/llama --tensor-parallel-size 2 --endpoint dyn://dynamo.vllm.generate
    python -m dynamo.vllm --model /models/llama --role prefill --endpoint dyn://dynamo.prefill.generate
    python -m dynamo.vllm --model /models/llama --role decode --endpoint dyn://dynamo.backend.generate

vLLM's own flags are accepted as ``vllm serve`` takes them; ``--help`` lists Dynamo's in
their own group. The worker is the shared base (``dynamo.engine``) with vLLM's adapter.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dynamo.engine.main import main as serve_engine


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from .worker import VllmAdapter

    return serve_engine(VllmAdapter(), argv, "python -m dynamo.vllm")


if __name__ == "__main__":
    sys.exit(main())

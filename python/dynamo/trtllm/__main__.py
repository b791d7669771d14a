"""``python -m dynamo.trtllm``: serve a TensorRT-LLM engine as a Dynamo token-level worker.

    python -m dynamo.trtllm --model-path Qwen/Qwen3-0.6B
    python -m dynamo.trtllm --model-path /models/llama --role prefill --endpoint dyn://dynamo.prefill.generate
    python -m dynamo.trtllm --model-path /models/llama --role decode --endpoint dyn://dynamo.backend.generate

A few engine flags of ours (``--tensor-parallel-size``, ``--max-batch-size`` ...), the
rest of ``tensorrt_llm.LLM``'s arguments in ``--extra-engine-args FILE.yaml``. The worker
is the shared base (``dynamo.engine``) with TensorRT-LLM's adapter; ``dynamo-run in=http
out=vllm`` runs it with ``DYN_VLLM_MODULE=dynamo.trtllm``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dynamo.engine.main import main as serve_engine


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from .worker import TrtllmAdapter

    return serve_engine(TrtllmAdapter(), argv, "python -m dynamo.trtllm")


if __name__ == "__main__":
    sys.exit(main())

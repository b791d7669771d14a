"""``python -m dynamo.sglang``: serve an SGLang engine as a Dynamo token-level worker.

    python -m dynamo.sglang --model-path Qwen/Qwen3-0.6B --page-size 16
    python -m dynamo.sglang --model-path /models/llama --role prefill --endpoint dyn://dynamo.prefill.generate
    python -m dynamo.sglang --model-path /models/llama --role decode --endpoint dyn://dynamo.backend.generate

SGLang's own flags are accepted as ``sglang serve`` takes them; ``--help`` lists Dynamo's
in their own groups. The worker is the shared base (``dynamo.engine``) with SGLang's
adapter; ``dynamo-run in=http out=vllm`` runs it with ``DYN_VLLM_MODULE=dynamo.sglang``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dynamo.engine.main import main as serve_engine


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    from .worker import SglangAdapter

    return serve_engine(SglangAdapter(), argv, "python -m dynamo.sglang")


if __name__ == "__main__":
    sys.exit(main())

"""The PrefillWorker: an LLM engine in the *prefill* role of disaggregated serving
(docs/disagg.md). It serves prefill jobs on ``{namespace}.PrefillWorker.generate``
(and, with NATS, pulls them from the JetStream queue ``{namespace}_prefill_queue``),
computes each prompt's KV cache and hands it to the decode Worker that asked. It
registers no model: frontends never see it.

The engine is chosen by configuration (``engine: mocker``, ``vllm``, ``sglang`` or
``trtllm``); every other key of the
PrefillWorker's configuration becomes a flag of the engine's own parser
(``max-concurrent-prefills: 2`` → ``--max-concurrent-prefills 2``), as for the Worker.

    python -m components.prefill_worker -f configs/disagg.yaml      # alone (from examples/llm)
    dynamo serve graphs.disagg:Frontend -f configs/disagg.yaml       # Worker.link(PrefillWorker)
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dynamo.sdk import BaseDeployment

from components.worker import parse_args as worker_args
from components.worker import run_engine


class PrefillWorker(BaseDeployment):
    namespace = "dynamo"
    endpoints = ["generate"]
    resources = {"cpu": "1"}


def endpoint() -> str:
    """Where the prefill workers serve (configuration applied): decode Workers send here."""
    namespace, name = PrefillWorker.dynamo_address()
    return f"dyn://{namespace}.{name}.generate"


def main(argv: Sequence[str] | None = None) -> int:
    """Serve prefill jobs with the configured engine until SIGINT/SIGTERM."""
    engine, flags = worker_args(argv, service_name=PrefillWorker.name)
    return run_engine(engine, ["--endpoint", endpoint(), "--role", "prefill", *flags])


if __name__ == "__main__":
    sys.exit(main())

"""LLM serving from Python: register a model served on an endpoint so that frontends
(``dynamo-run in=http out=dyn``) discover it, run the ``dynamo-run`` command line, and
KV-aware routing's building blocks: the index of the fleet's caches (``RadixTree``,
``KvIndexer``, ``compute_block_hash_for_seq``) and what engines publish to it
(``KvEventPublisher``, ``WorkerMetricsPublisher``, ``ZmqKvEventPublisher`` for vLLM's
ZMQ events). See docs/kv-routing.md.

```python
@dynamo_worker()
async def worker(runtime: DistributedRuntime) -> None:
    endpoint = runtime.namespace("dynamo").component("backend").endpoint("generate")
    serving = asyncio.create_task(endpoint.serve_endpoint(generate))
    await register_llm(endpoint, model_path="/models/tinyllama", kind=ModelType.Backend)
    await serving
```
"""

from __future__ import annotations

from typing import Final

from dynamo._core import (
    KvEventPublisher,
    KvIndexer,
    KvRouter,
    OverlapScores,
    RadixTree,
    WorkerMetricsPublisher,
    compute_block_hash_for_seq,
    register_llm,
    run_dynamo_run,
)
from dynamo.llm.zmq_kv import ZmqKvEventPublisher, ZmqKvEventPublisherConfig

__all__ = [
    "KvEventPublisher",
    "KvIndexer",
    "KvRouter",
    "ModelType",
    "OverlapScores",
    "RadixTree",
    "WorkerMetricsPublisher",
    "ZmqKvEventPublisher",
    "ZmqKvEventPublisherConfig",
    "compute_block_hash_for_seq",
    "register_llm",
    "run_dynamo_run",
]


class ModelType:
    """The kinds a model can be registered as (the ``kind`` of :func:`register_llm`)."""

    #: OpenAI chat requests in, chat chunks out: the worker templates and tokenizes.
    #: Frontends route completions requests to it too.
    Chat: Final = "chat"
    #: OpenAI completions requests in, completion chunks out.
    Completions: Final = "completions"
    #: Token level: a ``PreprocessedRequest`` dict in (``token_ids``, ``stop_conditions``,
    #: ``sampling_options``, ...), ``{"token_ids": [...]}`` dicts out, the last with a
    #: ``finish_reason``. The frontend tokenizes and detokenizes with the model card.
    Backend: Final = "backend"

    #: Every kind, for validation and help texts.
    ALL: Final = (Chat, Completions, Backend)

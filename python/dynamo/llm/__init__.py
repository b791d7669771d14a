"""LLM serving from Python: register a model served on an endpoint so that frontends
(``dynamo-run in=http out=dyn``) discover it, run the ``dynamo-run`` command line, and
KV-aware routing's building blocks: the index of the fleet's caches (``RadixTree``,
``KvIndexer``, ``compute_block_hash_for_seq``) and what engines publish to it
(``KvEventPublisher``, ``WorkerMetricsPublisher``, ``ZmqKvEventPublisher`` for vLLM's
ZMQ events). See docs/kv-routing.md. Disaggregated serving for a Python engine:
``RemotePrefill`` (decode side) and ``serve_prefill_worker`` (docs/disagg.md). Output
parsers for a Python processor (docs/tools.md): ``parse_tool_calls``,
``parse_reasoning`` and their stream forms ``ToolCallStream``, ``ReasoningStream``.

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

from collections.abc import Coroutine
from typing import Any, Final

from dynamo._core import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ChunkStream,
    Endpoint,
    KvEventPublisher,
    KvIndexer,
    KvRouter,
    OpenAIPreprocessor,
    OverlapScores,
    PrefillWorker,
    PreprocessedRequest,
    RadixTree,
    ReasoningStream,
    RemotePrefill,
    ToolCallStream,
    WorkerMetricsPublisher,
    compute_block_hash_for_seq,
    parse_reasoning,
    parse_tool_calls,
    run_dynamo_run,
    serve_prefill_worker,
)
from dynamo._core import register_llm as _register_llm
from dynamo.llm.zmq_kv import ZmqKvEventPublisher, ZmqKvEventPublisherConfig

__all__ = [
    "REASONING_PARSERS",
    "TOOL_CALL_PARSERS",
    "ChunkStream",
    "KvEventPublisher",
    "KvIndexer",
    "KvRouter",
    "ModelType",
    "OpenAIPreprocessor",
    "OverlapScores",
    "PrefillWorker",
    "PreprocessedRequest",
    "RadixTree",
    "ReasoningStream",
    "RemotePrefill",
    "ToolCallStream",
    "WorkerMetricsPublisher",
    "ZmqKvEventPublisher",
    "ZmqKvEventPublisherConfig",
    "compute_block_hash_for_seq",
    "parse_reasoning",
    "parse_tool_calls",
    "register_llm",
    "run_dynamo_run",
    "serve_prefill_worker",
]


class ModelType:
    """The kinds a model can be registered as (the ``kind`` of :func:`register_llm`)."""

    #: OpenAI chat requests in, chat chunks out: the worker templates and tokenizes.
    #: Frontends route completions requests to it too.
    Chat: Final = "chat"
    #: OpenAI completions requests in, completion chunks out.
    Completions: Final = "completions"
    #: The reference's spelling of :attr:`Completions`.
    Completion: Final = "completions"
    #: Token level: a ``PreprocessedRequest`` dict in (``token_ids``, ``stop_conditions``,
    #: ``sampling_options``, ...), ``{"token_ids": [...]}`` dicts out, the last with a
    #: ``finish_reason``. The frontend tokenizes and detokenizes with the model card.
    Backend: Final = "backend"

    #: Every kind, for validation and help texts.
    ALL: Final = (Chat, Completions, Backend)


def register_llm(*args: Any, **kwargs: Any) -> Coroutine[Any, Any, None]:
    """Register the model served on an endpoint so that frontends discover it.

    Two call shapes are accepted::

        await register_llm(endpoint, model_path, model_name, kind=ModelType.Backend, ...)
        await register_llm(ModelType.Backend, endpoint, model_path, model_name, ...)  # the reference's order

    Registering before the endpoint serves is fine: frontends list (and route to) the
    model only once an instance of the endpoint is serving. See ``_core.register_llm``
    for the other keyword arguments (``context_length``, ``kv_cache_block_size``,
    ``migration_limit``).
    """
    if args and isinstance(args[0], str):
        if len(args) < 2 or not isinstance(args[1], Endpoint):
            raise TypeError(
                "register_llm(model_type, endpoint, model_path, model_name): the second argument must be an Endpoint"
            )
        if "kind" in kwargs:
            raise TypeError("register_llm: the model type is given twice (positionally and as kind=)")
        kind, *rest = args
        kwargs["kind"] = kind
        args = tuple(rest)
    return _register_llm(*args, **kwargs)

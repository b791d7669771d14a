"""LLM serving from Python: register a model served on an endpoint so that frontends
(``dynamo-run in=http out=dyn``) discover it, and run the ``dynamo-run`` command line.

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

from dynamo._core import KvRouter, register_llm, run_dynamo_run

__all__ = ["KvRouter", "ModelType", "register_llm", "run_dynamo_run"]


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

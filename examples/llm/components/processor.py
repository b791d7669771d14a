"""The Processor: OpenAI requests in, OpenAI chunks out. It templates and tokenizes
each request with the model card (the Rust preprocessor, through
``dynamo.llm.OpenAIPreprocessor``), picks the Worker instance, and turns the Worker's
token stream back into chunks (the Rust detokenizer, stop strings and usage).

It serves ``{namespace}.Processor.chat/completions`` and registers the model there as a
chat model, so a frontend bound to that endpoint (``python -m dynamo.frontend
--endpoint dynamo.Processor.chat/completions``) serves it; chat and completions requests
both arrive there.

How it picks the instance (``router`` in its configuration):

- ``kv``: asks the Router service (``Router.generate({"token_ids": ...})``) for the
  worker id; the default when the graph links the Router (``Processor.link(Router)``);
- ``round-robin`` (the default otherwise) and ``random``: among the Worker's instances.

Configuration keys: ``model-path`` (a HuggingFace folder; default the built-in
byte-level card), ``model-name``, ``kv-cache-block-size``, ``context-length``,
``router``, ``min-workers`` (Worker instances to wait for before registering, default
1), ``worker-timeout`` (seconds to wait for them, default 120), ``router-timeout``
(seconds to wait for the Router's answer before routing round-robin, default 5),
``tool-call-parser``, ``reasoning-parser``, ``chat-template`` (docs/tools.md: the
processor builds the chat chunks, so it applies the output parsers).

    python -m components.processor -f configs/agg.yaml   # alone (from examples/llm)
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncIterator
from typing import Any

from dynamo.llm import ModelType, OpenAIPreprocessor, PreprocessedRequest, register_llm
from dynamo.runtime import RequestContext
from dynamo.sdk import async_on_start, depends, dynamo_context, endpoint, run_component, service
from dynamo.sdk.lib.config import ServiceConfig, ServiceConfigError

from components.router import Router
from components.worker import Worker

logger = logging.getLogger("processor")

ENDPOINT = "chat/completions"
ROUTER_MODES = ("kv", "round-robin", "random")


@service(dynamo={"namespace": "dynamo"})
class Processor:
    worker = depends(Worker)
    router = depends(Router)

    def __init__(self) -> None:
        config = ServiceConfig.get_parsed_config("Processor")
        linked = Processor.used_dependencies()  # the edges the graph's .link() calls kept
        default_mode = "kv" if "router" in linked and "worker" not in linked else "round-robin"
        self.mode = str(config.get("router", default_mode))
        if self.mode not in ROUTER_MODES:
            raise ServiceConfigError(f"Processor.router must be one of {list(ROUTER_MODES)}, got {self.mode!r}")
        self.model_path = config.get("model-path")
        self.model_name = config.get("model-name")
        self.block_size = config.get("kv-cache-block-size")
        self.context_length = config.get("context-length")
        # The output parsers (docs/tools.md): this processor builds the chat chunks.
        self.tool_call_parser = config.get("tool-call-parser")
        self.reasoning_parser = config.get("reasoning-parser")
        self.chat_template = config.get("chat-template")
        self.min_workers = int(config.get("min-workers", 1))
        self.worker_timeout = float(config.get("worker-timeout", 120))
        self.router_timeout = float(config.get("router-timeout", 5))

    @async_on_start
    async def start(self) -> None:
        self.preprocessor = OpenAIPreprocessor(
            model_path=self.model_path,
            model_name=self.model_name,
            context_length=self.context_length,
            kv_cache_block_size=self.block_size,
            tool_call_parser=self.tool_call_parser,
            reasoning_parser=self.reasoning_parser,
            chat_template=self.chat_template,
        )
        self.workers = await self.worker.client("generate")
        # The model becomes visible to frontends only once the requests it gets can go
        # somewhere: wait (bounded) for the Worker instances first.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.worker_timeout
        while len(self.workers.instance_ids()) < self.min_workers:
            if loop.time() >= deadline:
                raise RuntimeError(
                    f"Processor: fewer than {self.min_workers} Worker instance(s) after {self.worker_timeout:.0f}s"
                )
            await asyncio.sleep(0.2)
        endpoint = dynamo_context["component"].endpoint(ENDPOINT)
        await register_llm(endpoint, self.model_path, self.preprocessor.model_name, kind=ModelType.Chat)
        logger.info("Processor: model %s, router %s", self.preprocessor.model_name, self.mode)

    async def choose(self, request: PreprocessedRequest) -> int | None:
        """The Worker instance for ``request`` (None: the client's round-robin)."""
        if self.mode == "kv":
            try:
                answer = await asyncio.wait_for(self.router.generate({"token_ids": request.token_ids}),
                                                self.router_timeout)
            except Exception as exc:  # the Router is down or slow: the request still goes out
                logger.warning("Processor: no answer from the Router (%s); routing round-robin", exc or type(exc))
                return None
            worker_id = answer.get("worker_id") if isinstance(answer, dict) else None
            return int(worker_id) if worker_id is not None else None
        if self.mode == "random":
            instances = self.workers.instance_ids()
            return random.choice(instances) if instances else None
        return None

    @endpoint(ENDPOINT)
    async def generate(self, request: dict[str, Any], context: RequestContext) -> AsyncIterator[Any]:
        pre = self.preprocessor.preprocess(request)
        instance = await self.choose(pre)
        stream = await self.preprocessor.generate(pre, self.workers, instance_id=instance, context=context)
        async for item in stream:
            yield item


if __name__ == "__main__":
    run_component(Processor)

"""Serving an engine until the runtime shuts down: start it, register its model (kind
``backend``) with its context length and KV block size, serve ``generate`` in the
worker's role, bridge its KV events and load metrics to the event plane, and on
shutdown let the endpoint drain before the engine stops.

Readiness (the system server's ``/ready``): the runtime's readiness mark is held from
before ``generate`` is served until the model is registered and the engine answered a
one-token request sent to this very instance (``engine_answers``), so a probe says 200
only for a worker that can be routed to and whose engine answers.

Disaggregated (``--role prefill|decode``, docs/disagg.md): a prefill worker serves the
core's prefill jobs with ``Handler.prefill`` (registering no model); a decode worker
wraps ``Handler.generate`` in the core's remote-prefill step (``dynamo.llm.disagg``),
which hands the prefill's transfer parameters to the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

from dynamo.engine.adapter import EngineAdapter
from dynamo.engine.config import WorkerConfig, parse_endpoint
from dynamo.engine.handler import Handler
from dynamo.engine.kv_events import KvEventBridge

log = logging.getLogger("dynamo.engine")

#: Seconds the engine gets to answer the readiness check's one-token request.
READY_CHECK_TIMEOUT = 120.0


def local_model_dir(model: str) -> str | None:
    """The local folder of ``model`` for the model card (tokenizer, config): the path
    itself, or the HuggingFace cache's snapshot of a hub id the engine downloaded."""
    if Path(model).is_dir():
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception as e:
        log.warning("no local copy of %s for the model card (%s); registering the built-in card", model, e)
        return None


async def serve_role(
    runtime: Any, config: WorkerConfig, endpoint: Any, handler: Handler, context_length: int, block_size: int
) -> None:
    """Serve ``handler`` in ``config.role`` until the runtime shuts down: prefill jobs
    (no model registered), or ``generate`` (behind the core's remote-prefill step for a
    decode worker) with the model registered."""
    from dynamo.llm import disagg, register_llm

    name = handler.adapter.name
    if config.role == "prefill":
        log.info("serving prefill jobs (%s, KV block %d) on %s", name, block_size, config.endpoint)
        await disagg.serve_prefill(runtime, endpoint, handler.prefill, block_size, config.max_concurrent_prefills)
        return
    generate: Any = handler.generate
    if config.role == "decode":
        remote = await disagg.connect_decode(endpoint, config)
        log.info("decode role: prefill queue on %s", remote.transport)
        cached_tokens = None
        if config.kv_events:
            # Engines here have no query of their prefix cache: read it back from
            # their own KV events.
            namespace, component_name, _ = parse_endpoint(config.endpoint)
            component = runtime.namespace(namespace).component(component_name)
            cached_tokens = disagg.own_cached_tokens(component, block_size, runtime.instance_id())
        generate = disagg.decode_handler(remote, handler.generate, cached_tokens)
    runtime.set_ready(False)
    serving = asyncio.create_task(endpoint.serve_endpoint(generate))
    await register_llm(
        endpoint,
        model_path=local_model_dir(config.model_path),
        model_name=config.model_name,
        kind="backend",
        context_length=context_length,
        kv_cache_block_size=block_size,
        migration_limit=config.migration_limit,
        tool_call_parser=config.tool_call_parser,
        reasoning_parser=config.reasoning_parser,
        chat_template=config.chat_template,
    )
    log.info(
        "serving %s (%s, role %s, context %d, KV block %d) on %s",
        config.model_name, name, config.role, context_length, block_size, config.endpoint,
    )
    try:
        await asyncio.wait_for(engine_answers(runtime, endpoint), READY_CHECK_TIMEOUT)
    except Exception as e:
        if not runtime.is_shutting_down():
            # Serving goes on; /ready keeps saying engine_not_ready, which is the truth.
            log.error("the engine did not answer the readiness check (%s: %s); not ready", type(e).__name__, e)
    else:
        runtime.set_ready(True)
        log.info("the engine answered; ready")
    await serving


async def engine_answers(runtime: Any, endpoint: Any) -> None:
    """Send a one-token request to this worker's own instance (the whole path: discovery,
    the request plane, the handler, the engine) and read its stream to the end. Any item
    is an answer, a refusal too (a decode-only engine refuses to prefill); raises when
    the stream fails or ends empty."""
    client = await endpoint.client()
    own = runtime.instance_id()
    while own not in client.instance_ids():
        await client.wait_for_instances()
        if own not in client.instance_ids():
            await asyncio.sleep(0.05)  # the watch has not delivered our own registration yet
    request = {"token_ids": [1], "stop_conditions": {"max_tokens": 1}, "sampling_options": {}, "eos_token_ids": []}
    stream = await client.direct(request, own, annotated=False)
    items = [item async for item in stream]
    if not items:
        raise RuntimeError("the stream ended without an item")


async def _publish_load(reports: Any, publish: Any) -> None:
    async for load in reports:
        publish(load)


async def serve(runtime: Any, config: WorkerConfig, adapter: EngineAdapter) -> None:
    """Run the engine and serve it until the runtime shuts down."""
    namespace, component_name, name = parse_endpoint(config.endpoint)
    component = runtime.namespace(namespace).component(component_name)
    endpoint = component.endpoint(name)
    publish = None
    if config.metrics:
        from dynamo.llm import WorkerMetricsPublisher

        metrics = WorkerMetricsPublisher(component)

        def publish(load: dict[str, Any]) -> None:
            metrics.publish(**load)

    engine = await adapter.start(config, publish)
    events: KvEventBridge | None = None
    load_task: asyncio.Task[None] | None = None
    try:
        context_length, block_size = adapter.limits(engine)
        source = adapter.kv_events(config, engine) if config.kv_events else None
        if source is not None:
            events = KvEventBridge(component, source, block_size)
        reports = adapter.load_reports(engine) if publish is not None else None
        if reports is not None:
            load_task = asyncio.create_task(_publish_load(reports, publish))
        await serve_role(runtime, config, endpoint, Handler(adapter, engine, runtime), context_length, block_size)
    finally:
        if load_task is not None:
            load_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await load_task
        if events is not None:
            await events.shutdown()
        await adapter.stop(engine)

"""A vLLM engine served as a Dynamo token-level worker: start ``AsyncLLM``, serve
``generate`` on the endpoint, register the model (kind ``backend``) with vLLM's context
length and KV block size, and stream each request's tokens back.

Disaggregated (``--role prefill|decode``, docs/disagg.md): both engines run vLLM's KV
connector; a prefill worker serves the core's prefill jobs with ``Handler.prefill``
(registering no model), a decode worker wraps ``Handler.generate`` in the core's
remote-prefill step (``dynamo.llm.disagg``) and passes the prefill's transfer parameters
to vLLM, whose connector pulls the KV.

The frontend tokenizes (with the model card registered here), detokenizes, applies stop
strings and counts usage; this worker only turns token ids into token ids.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from dynamo.llm import disagg, register_llm
from dynamo.runtime import DistributedRuntime, Endpoint, RequestContext

from . import adapter
from .args import Config

log = logging.getLogger("dynamo.vllm")


class Handler:
    """``generate`` of the endpoint: one vLLM request per call.

    * The caller stops the stream (stop string, ``max_tokens`` reached at the frontend):
      the vLLM request is aborted and the stream ends with ``cancelled``.
    * The caller goes away: the runtime cancels this task; vLLM's ``generate`` aborts
      its request when cancelled.
    * A request vLLM rejects (prompt too long, bad parameters) ends with an error finish
      reason naming vLLM's message; the worker keeps serving.
    * vLLM's engine died: the stream ends with an error and the runtime is shut down, so
      the worker leaves discovery and frontends send new requests elsewhere (or migrate).
    """

    def __init__(self, engine: Any, runtime: DistributedRuntime | None = None) -> None:
        self.engine = engine
        self.runtime = runtime

    async def generate(
        self, request: dict[str, Any], context: RequestContext, transfer: dict[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the request's tokens; ``transfer``: a prefill worker's descriptor of
        the prompt's KV (decode role), which vLLM's connector then pulls."""
        from vllm.v1.engine.exceptions import EngineDeadError

        request_id = context.id()
        try:
            prompt = adapter.tokens_prompt(request)
            params = adapter.sampling_params(request, adapter.decode_transfer_params(transfer))
        except (adapter.RequestError, ValueError, TypeError) as e:
            yield {"token_ids": [], "finish_reason": {"error": f"invalid request: {e}"}}
            return
        top_logprobs = (request.get("output_options") or {}).get("logprobs") or 0
        try:
            async for output in self.engine.generate(prompt, params, request_id):
                item = adapter.engine_output(output, top_logprobs)
                if "finish_reason" not in item and context.is_stopped():
                    await self.engine.abort(request_id)
                    item["finish_reason"] = "cancelled"
                    yield item
                    return
                yield item
                if "finish_reason" in item:
                    return
        except EngineDeadError as e:
            log.error("vLLM engine died: %s; shutting the worker down", e)
            yield {"token_ids": [], "finish_reason": {"error": f"the vLLM engine died: {e}"}}
            if self.runtime is not None:
                self.runtime.shutdown()
            return
        except (ValueError, TypeError) as e:
            # vLLM's request validation (e.g. a prompt longer than max_model_len).
            yield {"token_ids": [], "finish_reason": {"error": str(e)}}
            return
        # vLLM's stream ended without a finished output: never report that as a normal end.
        yield {"token_ids": [], "finish_reason": {"error": "vLLM ended the stream without finishing the request"}}


    async def prefill(self, request: dict[str, Any], context: RequestContext) -> dict[str, Any]:
        """A prefill job (prefill role): compute the prompt (one token), leaving its KV
        with vLLM's connector for the decode worker; return the connector's transfer
        parameters. Raising fails the job (the decode worker then prefills locally)."""
        from vllm.v1.engine.exceptions import EngineDeadError

        request_id = context.id()
        prompt = adapter.tokens_prompt(request)
        params = adapter.prefill_sampling_params(request)
        final = None
        try:
            async for output in self.engine.generate(prompt, params, request_id):
                final = output
                if context.is_stopped() and not output.finished:
                    await self.engine.abort(request_id)
                    raise adapter.RequestError("the prefill job was given up")
        except EngineDeadError as e:
            log.error("vLLM engine died: %s; shutting the worker down", e)
            if self.runtime is not None:
                self.runtime.shutdown()
            raise
        if final is None:
            raise adapter.RequestError("vLLM produced no output for the prefill")
        return adapter.prefill_transfer_params(final)


def configure_disagg(config: Config, side_channel_port: int | None = None) -> None:
    """Give a prefill or decode worker's engine its KV connector
    (``adapter.kv_transfer_config``). With NixlConnector and no
    ``VLLM_NIXL_SIDE_CHANNEL_PORT`` in the environment, its side channel (the handshake
    decode workers connect to) gets ``side_channel_port``: every worker would otherwise
    take vLLM's default, 5600, and two on one host would collide."""
    if config.role == "agg":
        return
    kv = adapter.kv_transfer_config(config.engine_args.kv_transfer_config)
    config.engine_args.kv_transfer_config = kv
    if kv.kv_connector == adapter.DEFAULT_KV_CONNECTOR and side_channel_port is not None:
        os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side_channel_port))


def configure_kv_events(config: Config, port: int) -> None:
    """Ask vLLM to publish KV cache events on ZMQ port ``port`` unless the command line
    configured its own ``--kv-events-config``. vLLM binds only wildcard endpoints (it
    connects to any other), so the endpoint is ``tcp://*:port``; the worker's bridge
    connects to it on loopback."""
    from vllm.config import KVEventsConfig

    args = config.engine_args
    if not config.kv_events:
        return
    if args.kv_events_config is None:
        args.kv_events_config = KVEventsConfig(
            enable_kv_cache_events=True, publisher="zmq", endpoint=f"tcp://*:{port}"
        )
    args.enable_prefix_caching = True


def local_model_dir(model: str) -> str | None:
    """The local folder of ``model`` for the model card (tokenizer, config): the path
    itself, or the HuggingFace cache's snapshot of a hub id that vLLM downloaded."""
    if Path(model).is_dir():
        return model
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(model, local_files_only=True)
    except Exception as e:
        log.warning("no local copy of %s for the model card (%s); registering the built-in card", model, e)
        return None


async def serve_role(
    runtime: DistributedRuntime, config: Config, endpoint: Endpoint, handler: Handler, context_length: int,
    block_size: int,
) -> None:
    """Serve ``handler`` in ``config.role`` until the runtime shuts down: prefill jobs
    (no model registered), or ``generate`` (behind the core's remote-prefill step for a
    decode worker) with the model registered."""
    if config.role == "prefill":
        log.info("serving prefill jobs (vLLM, KV block %d) on %s", block_size, config.endpoint)
        await disagg.serve_prefill(runtime, endpoint, handler.prefill, block_size, config.max_concurrent_prefills)
        return
    generate: Any = handler.generate
    if config.role == "decode":
        remote = await disagg.connect_decode(endpoint, config)
        log.info("decode role: prefill queue on %s", remote.transport)
        cached_tokens = None
        if config.kv_events:
            # vLLM has no query of its prefix cache: read it back from its own KV events.
            namespace, component_name, _ = config.endpoint.removeprefix("dyn://").split(".")
            component = runtime.namespace(namespace).component(component_name)
            cached_tokens = disagg.own_cached_tokens(component, block_size, runtime.instance_id())
        generate = disagg.decode_handler(remote, handler.generate, cached_tokens)
    serving = asyncio.create_task(endpoint.serve_endpoint(generate))
    await register_llm(
        endpoint,
        model_path=local_model_dir(config.model_path),
        model_name=config.model_name,
        kind="backend",
        context_length=context_length,
        kv_cache_block_size=block_size,
        migration_limit=config.migration_limit,
    )
    log.info(
        "serving %s (vLLM, role %s, context %d, KV block %d) on %s",
        config.model_name, config.role, context_length, block_size, config.endpoint,
    )
    await serving


async def serve(runtime: DistributedRuntime, config: Config) -> None:
    """Run the engine and serve it until the runtime shuts down."""
    from vllm.v1.engine.async_llm import AsyncLLM

    namespace, component_name, name = config.endpoint.removeprefix("dyn://").split(".")
    component = runtime.namespace(namespace).component(component_name)
    endpoint = component.endpoint(name)
    stat_loggers = None
    if config.metrics:
        from dynamo.llm import WorkerMetricsPublisher

        metrics = WorkerMetricsPublisher(component)
        stat_loggers = [adapter.LoadStatLogger.factory(lambda load: metrics.publish(**load))]
    engine = AsyncLLM.from_engine_args(config.engine_args, stat_loggers=stat_loggers)
    events = None
    try:
        model_config = engine.vllm_config.model_config
        cache_config = engine.vllm_config.cache_config
        if config.kv_events and config.engine_args.kv_events_config is not None:
            from dynamo.llm import ZmqKvEventPublisher, ZmqKvEventPublisherConfig

            # vLLM's ZMQ publisher binds the endpoint; this process subscribes to it and
            # republishes on the event plane, where KV routers follow the component.
            zmq_endpoint = config.engine_args.kv_events_config.endpoint.replace("*", "127.0.0.1")
            events = ZmqKvEventPublisher(
                component, ZmqKvEventPublisherConfig(kv_block_size=cache_config.block_size, zmq_endpoint=zmq_endpoint)
            )
        await serve_role(
            runtime, config, endpoint, Handler(engine, runtime), model_config.max_model_len, cache_config.block_size
        )
    finally:
        if events is not None:
            await events.shutdown()
        engine.shutdown()

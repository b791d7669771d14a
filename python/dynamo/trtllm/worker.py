"""TensorRT-LLM's adapter of the worker base (``dynamo.engine``): a ``tensorrt_llm.LLM``
(PyTorch backend by default) built from a few flags of ours plus
``--extra-engine-args`` (a YAML file of ``LLM`` keyword arguments, as
``trtllm-serve --extra_llm_api_options`` takes), requests through
``LLM.generate_async(token_ids, SamplingParams(...), streaming=True)``, aborts through
the result's ``abort()``, KV events from ``LLM.get_kv_cache_events_async`` (block reuse
and an event buffer are switched on for them), load from ``LLM.get_stats_async``, and
disaggregation through ``DisaggregatedParams`` (``context_only`` on the prefill worker,
``generation_only`` with the context's parameters on the decode worker; both need a
cache transceiver, configured here unless the YAML sets one).

Written against TensorRT-LLM's LLM API sources; never run here (it needs a CUDA GPU).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from dynamo.engine.adapter import EngineAdapter, Failure, LoadCallback, RequestError
from dynamo.engine.config import WorkerConfig
from dynamo.engine.kv_events import KvEvent, KvEventSource

from . import adapter

#: Seconds each poll of TensorRT-LLM's event and stats queues waits.
POLL_TIMEOUT = 2.0
#: TensorRT-LLM's default tokens per KV block.
DEFAULT_TOKENS_PER_BLOCK = 32


def llm_kwargs(ns: argparse.Namespace, config: WorkerConfig) -> dict[str, Any]:
    """``tensorrt_llm.LLM`` keyword arguments: ``--extra-engine-args`` first, our flags
    over it. The KV cache and cache-transceiver configurations stay dicts here (the
    worker builds TensorRT-LLM's classes from them)."""
    kwargs: dict[str, Any] = {}
    if ns.extra_engine_args:
        import yaml

        with open(ns.extra_engine_args) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{ns.extra_engine_args}: expected a mapping of LLM arguments")
        kwargs.update(loaded)
    kwargs.update(model=config.model_path, backend=ns.backend, tensor_parallel_size=ns.tensor_parallel_size,
                  skip_tokenizer_init=True)
    if ns.max_batch_size is not None:
        kwargs["max_batch_size"] = ns.max_batch_size
    if ns.max_num_tokens is not None:
        kwargs["max_num_tokens"] = ns.max_num_tokens
    if ns.context_length is not None:
        kwargs["max_seq_len"] = ns.context_length
    if ns.kv_cache_block_size is not None:
        kwargs["tokens_per_block"] = ns.kv_cache_block_size
    kv = dict(kwargs.get("kv_cache_config") or {})
    kv.setdefault("free_gpu_memory_fraction", ns.free_gpu_memory_fraction)
    if config.kv_events:
        # TensorRT-LLM emits KV events only with block reuse and an event buffer.
        kv.update(enable_block_reuse=True)
        kv.setdefault("event_buffer_max_size", 1024)
    kwargs["kv_cache_config"] = kv
    if config.role != "agg":
        kwargs.setdefault("cache_transceiver_config", {"backend": "DEFAULT"})
    if config.metrics:
        kwargs.setdefault("enable_iter_perf_stats", True)
    return kwargs


class TrtllmAdapter(EngineAdapter):
    """TensorRT-LLM's ``LLM`` API."""

    name = "TensorRT-LLM"
    package = "tensorrt_llm"
    install_hint = "pip install tensorrt_llm (NVIDIA's wheels; a CUDA GPU is needed)"

    def __init__(self) -> None:
        self.context_length = 0
        self.running: dict[str, Any] = {}

    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=prog, description=description)
        group = p.add_argument_group("TensorRT-LLM")
        group.add_argument("--backend", default="pytorch", help="LLM backend (default pytorch)")
        group.add_argument("--tensor-parallel-size", type=int, default=1)
        group.add_argument("--max-batch-size", type=int)
        group.add_argument("--max-num-tokens", type=int)
        group.add_argument("--free-gpu-memory-fraction", type=float, default=0.9,
                           help="share of free GPU memory for the KV cache (default 0.9)")
        group.add_argument("--extra-engine-args", help="a YAML file of tensorrt_llm.LLM keyword arguments")
        return p

    def model_path(self, ns: argparse.Namespace) -> str | None:
        return ns.model_path

    def engine_args(
        self, ns: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser, config: WorkerConfig
    ) -> Any:
        try:
            return llm_kwargs(ns, config)
        except (OSError, ValueError) as e:
            parser.error(f"--extra-engine-args: {e}")

    async def start(self, config: WorkerConfig, on_load: LoadCallback | None) -> Any:
        from tensorrt_llm import LLM
        from tensorrt_llm.llmapi import KvCacheConfig

        kwargs = dict(config.engine_args)
        kwargs["kv_cache_config"] = KvCacheConfig(**kwargs["kv_cache_config"])
        if isinstance(kwargs.get("cache_transceiver_config"), dict):
            from tensorrt_llm.llmapi import CacheTransceiverConfig

            kwargs["cache_transceiver_config"] = CacheTransceiverConfig(**kwargs["cache_transceiver_config"])
        llm = LLM(**kwargs)
        self.context_length = int(getattr(llm.args, "max_seq_len", None) or 0)
        return llm

    def limits(self, engine: Any) -> tuple[int, int]:
        block = getattr(engine.args, "tokens_per_block", None) or getattr(
            engine.args.kv_cache_config, "tokens_per_block", None
        )
        return self.context_length, int(block or DEFAULT_TOKENS_PER_BLOCK)

    def kv_events(self, config: WorkerConfig, engine: Any) -> KvEventSource | None:
        return self._kv_events(engine)

    async def _kv_events(self, engine: Any) -> AsyncIterator[KvEvent]:
        while True:
            async for event in engine.get_kv_cache_events_async(timeout=POLL_TIMEOUT):
                ours = adapter.kv_event(event)
                if ours is not None:
                    yield ours
            await asyncio.sleep(0)

    async def load_reports(self, engine: Any) -> AsyncIterator[dict[str, Any]]:
        while True:
            async for stats in engine.get_stats_async(timeout=POLL_TIMEOUT):
                yield adapter.load_metrics(stats)
            await asyncio.sleep(0)

    async def stop(self, engine: Any) -> None:
        engine.shutdown()

    def prepare(self, request: Mapping[str, Any], transfer: Mapping[str, Any] | None = None) -> Any:
        token_ids = adapter.prompt_token_ids(request)
        room = max(1, self.context_length - len(token_ids)) if self.context_length else 1 << 20
        kwargs = adapter.sampling_kwargs(request, room)
        guided = adapter.guided_decoding(request.get("response_format"))
        top = (request.get("output_options") or {}).get("logprobs") or 0
        return token_ids, kwargs, guided, adapter.decode_disagg_kwargs(transfer), top

    def _sampling_params(self, kwargs: dict[str, Any], guided: dict[str, Any] | None) -> Any:
        from tensorrt_llm import SamplingParams

        if guided is not None:
            from tensorrt_llm.sampling_params import GuidedDecodingParams

            kwargs = {**kwargs, "guided_decoding": GuidedDecodingParams(**guided)}
        return SamplingParams(**kwargs)

    async def generate(self, engine: Any, prepared: Any, request_id: str) -> AsyncIterator[dict[str, Any]]:
        token_ids, kwargs, guided, disagg, top = prepared
        disaggregated_params = None
        if disagg is not None:
            from tensorrt_llm.llmapi import DisaggregatedParams

            disaggregated_params = DisaggregatedParams(**disagg)
        result = engine.generate_async(
            token_ids, self._sampling_params(kwargs, guided), streaming=True,
            disaggregated_params=disaggregated_params,
        )
        self.running[request_id] = result
        try:
            async for output in result:
                yield adapter.engine_output(output, top)
        finally:
            self.running.pop(request_id, None)
            if not result.finished:
                result.abort()

    async def abort(self, engine: Any, request_id: str) -> None:
        result = self.running.get(request_id)
        if result is not None:
            result.abort()

    def failure(self, error: BaseException) -> Failure | None:
        from tensorrt_llm.executor.utils import RequestError as TrtRequestError

        if isinstance(error, (TrtRequestError, ValueError, TypeError)):
            return Failure.REJECTED
        if isinstance(error, RuntimeError):
            # The executor's fatal errors (CppExecutorError, "LLM is shutting down").
            return Failure.DEAD
        return None

    async def prefill(
        self, engine: Any, request: Mapping[str, Any], request_id: str, stopped: Callable[[], bool]
    ) -> dict[str, Any]:
        """Run the context phase only; return its ``DisaggregatedParams`` as JSON."""
        from tensorrt_llm.llmapi import DisaggregatedParams

        token_ids, kwargs, guided, _, _ = self.prepare(request)
        kwargs = {**kwargs, "max_tokens": 1}
        result = engine.generate_async(
            token_ids, self._sampling_params(kwargs, guided), streaming=False,
            disaggregated_params=DisaggregatedParams(request_type="context_only"),
        )
        output = await result
        if not output.outputs:
            raise RequestError("TensorRT-LLM produced no output for the context phase")
        return adapter.prefill_transfer_params(output.outputs[0].disaggregated_params)

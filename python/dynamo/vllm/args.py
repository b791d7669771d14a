"""The command line of ``python -m dynamo.vllm``: vLLM's own engine flags, parsed by vLLM's
own parser (``AsyncEngineArgs.add_cli_args``), plus Dynamo's flags in their own group.

Under ``dynamo serve`` the same flags arrive from YAML through
``ServiceConfig.as_args(...)`` (``enforce-eager: true`` → ``--enforce-eager``), so a
graph's configuration, ``--Worker.key=value`` overrides and a plain command line all
reach one parser.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vllm.engine.arg_utils import AsyncEngineArgs

DEFAULT_ENDPOINT = "dyn://dynamo.backend.generate"
#: Where a prefill worker serves unless told (where decode workers look by default).
DEFAULT_PREFILL_ENDPOINT = "dyn://dynamo.prefill.generate"


@dataclasses.dataclass
class Config:
    """What ``python -m dynamo.vllm`` runs: Dynamo's settings and vLLM's engine args."""

    endpoint: str
    """``dyn://namespace.component.endpoint`` served by this worker."""
    model_name: str
    """The public model name (``model`` in OpenAI requests)."""
    model_path: str
    """What vLLM loads (a folder or a HuggingFace id)."""
    migration_limit: int
    role: str
    """``agg``, ``prefill`` or ``decode`` (docs/disagg.md)."""
    prefill_endpoint: str | None
    """Decode: the prefill workers' endpoint (default ``NAMESPACE.prefill.generate``)."""
    max_local_prefill_length: int
    max_prefill_queue_size: int
    remote_prefill_timeout: float
    max_concurrent_prefills: int
    kv_events: bool
    """Publish vLLM's KV cache events (for ``--router-mode kv``)."""
    kv_events_port: int
    metrics: bool
    """Publish load metrics from vLLM's scheduler stats."""
    engine_args: AsyncEngineArgs


def parser() -> argparse.ArgumentParser:
    """vLLM's engine-argument parser with Dynamo's group added."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from dynamo.llm import disagg

    p = FlexibleArgumentParser(
        prog="python -m dynamo.vllm",
        description="Serve a vLLM engine as a Dynamo token-level worker and register its model.",
    )
    group = p.add_argument_group("Dynamo")
    group.add_argument(
        "--endpoint",
        help=f"where to serve (default {DEFAULT_ENDPOINT}; with --role prefill {DEFAULT_PREFILL_ENDPOINT})",
    )
    group.add_argument("--model-path", help="alias of vLLM's --model")
    group.add_argument(
        "--model-name", help="the public model name (default: --served-model-name, else the model's folder name)"
    )
    group.add_argument("--kv-cache-block-size", type=int, help="alias of vLLM's --block-size")
    group.add_argument("--context-length", type=int, help="alias of vLLM's --max-model-len")
    group.add_argument(
        "--migration-limit", type=int, default=0,
        help="times a frontend may continue a broken stream of this model on another worker (default 0)",
    )
    group.add_argument(
        "--kv-events", action=argparse.BooleanOptionalAction, default=True,
        help="publish vLLM's KV cache events on the event plane (default on)",
    )
    group.add_argument(
        "--kv-events-port", type=int, default=0,
        help="loopback port of vLLM's ZMQ event publisher (default 0: a free one)",
    )
    group.add_argument(
        "--metrics", action=argparse.BooleanOptionalAction, default=True,
        help="publish load metrics from vLLM's scheduler (default on)",
    )
    disagg.add_arguments(
        p.add_argument_group(
            "Dynamo: disaggregated serving",
            "prefill and decode workers run vLLM's KV connector (--kv-transfer-config; default NixlConnector, "
            "kv_role kv_both); see docs/disagg.md",
        )
    )
    return AsyncEngineArgs.add_cli_args(p)


def visible_gpus() -> int | None:
    """GPUs this process may use per ``CUDA_VISIBLE_DEVICES`` (``dynamo serve`` sets it from
    ``resources.gpu``); ``None`` when unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])


def tensor_parallel(ns: argparse.Namespace, argv: list[str], p: argparse.ArgumentParser) -> None:
    """Keep tensor parallelism and the visible GPUs consistent: without
    ``--tensor-parallel-size``, use every visible GPU (a graph's ``resources.gpu: 2`` means
    TP 2); with it, the GPUs must be there."""
    given = any(a in ("-tp", "--tensor-parallel-size") or a.startswith("--tensor-parallel-size=") for a in argv)
    gpus = visible_gpus()
    if gpus is None:
        return
    if not given and gpus > 1:
        ns.tensor_parallel_size = gpus
    elif given and ns.tensor_parallel_size * ns.pipeline_parallel_size > gpus:
        p.error(
            f"--tensor-parallel-size {ns.tensor_parallel_size} (x pipeline {ns.pipeline_parallel_size}) needs more "
            f"GPUs than CUDA_VISIBLE_DEVICES gives this process ({gpus}); raise resources.gpu or lower it"
        )


def parse_args(argv: Sequence[str]) -> Config:
    """Parse ``argv``; usage errors exit with status 2, as argparse does."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    p = parser()
    ns = p.parse_args(list(argv))
    if ns.model_path:
        ns.model = ns.model_path
    if ns.kv_cache_block_size is not None:
        ns.block_size = ns.kv_cache_block_size
    if ns.context_length is not None:
        ns.max_model_len = ns.context_length
    if ns.migration_limit < 0:
        p.error("--migration-limit must be at least 0")
    tensor_parallel(ns, list(argv), p)
    if ns.role == "prefill":
        # A prefill worker's cache serves no router: its blocks leave with the transfer.
        ns.kv_events = False
    if ns.max_concurrent_prefills < 1 or ns.max_local_prefill_length < 0 or ns.max_prefill_queue_size < 0:
        p.error("--max-concurrent-prefills must be at least 1; the prefill thresholds at least 0")
    if not ns.remote_prefill_timeout > 0:
        p.error("--remote-prefill-timeout must be a positive number of seconds")
    if ns.endpoint is None:
        ns.endpoint = DEFAULT_PREFILL_ENDPOINT if ns.role == "prefill" else DEFAULT_ENDPOINT
    endpoint = ns.endpoint if ns.endpoint.startswith("dyn://") else f"dyn://{ns.endpoint}"
    if len(endpoint.removeprefix("dyn://").split(".")) != 3:
        p.error(f"--endpoint {ns.endpoint!r}: expected namespace.component.endpoint")
    served = ns.served_model_name
    model_name = ns.model_name or (served[0] if served else None) or Path(str(ns.model).rstrip("/")).name
    if not ns.served_model_name:
        ns.served_model_name = [model_name]
    if ns.kv_events and ns.enable_prefix_caching is False:
        p.error("--kv-events needs prefix caching (drop --no-enable-prefix-caching, or pass --no-kv-events)")
    engine_args = AsyncEngineArgs.from_cli_args(ns)
    return Config(
        endpoint=endpoint,
        model_name=model_name,
        model_path=str(ns.model),
        migration_limit=ns.migration_limit,
        role=ns.role,
        prefill_endpoint=ns.prefill_endpoint,
        max_local_prefill_length=ns.max_local_prefill_length,
        max_prefill_queue_size=ns.max_prefill_queue_size,
        remote_prefill_timeout=ns.remote_prefill_timeout,
        max_concurrent_prefills=ns.max_concurrent_prefills,
        kv_events=ns.kv_events,
        kv_events_port=ns.kv_events_port,
        metrics=ns.metrics,
        engine_args=engine_args,
    )

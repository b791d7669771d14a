"""The command line of ``python -m dynamo.vllm``: vLLM's own engine flags, parsed by vLLM's
own parser (``AsyncEngineArgs.add_cli_args``), plus Dynamo's flags in their own groups
(``dynamo.engine.config``, shared by every engine worker).

Dynamo's spellings are aliases of vLLM's flags: ``--model-path`` of ``--model``,
``--kv-cache-block-size`` of ``--block-size``, ``--context-length`` of ``--max-model-len``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

from dynamo.engine.config import DEFAULT_ENDPOINT, DEFAULT_PREFILL_ENDPOINT, WorkerConfig, new_parser
from dynamo.engine.config import parse_args as parse_worker_args

__all__ = ["DEFAULT_ENDPOINT", "DEFAULT_PREFILL_ENDPOINT", "Config", "parse_args", "parser"]

#: What ``python -m dynamo.vllm`` runs: Dynamo's settings, and vLLM's ``AsyncEngineArgs``
#: as ``engine_args``.
Config = WorkerConfig

PROG = "python -m dynamo.vllm"


def vllm_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """vLLM's engine-argument parser."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    p = FlexibleArgumentParser(prog=prog, description=description)
    return AsyncEngineArgs.add_cli_args(p)


def parser() -> argparse.ArgumentParser:
    """vLLM's engine-argument parser with Dynamo's groups added."""
    from .worker import VllmAdapter

    return new_parser(VllmAdapter(), PROG)


def visible_gpus() -> int | None:
    """GPUs this process may use per ``CUDA_VISIBLE_DEVICES`` (``dynamo serve`` sets it from
    ``resources.gpu``); ``None`` when unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])


def tensor_parallel(ns: argparse.Namespace, argv: Sequence[str], p: argparse.ArgumentParser) -> None:
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


def engine_args(ns: argparse.Namespace, argv: Sequence[str], p: argparse.ArgumentParser, config: WorkerConfig) -> Any:
    """vLLM's ``AsyncEngineArgs`` from the parsed flags, Dynamo's aliases applied."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    ns.model = config.model_path
    if ns.kv_cache_block_size is not None:
        ns.block_size = ns.kv_cache_block_size
    if ns.context_length is not None:
        ns.max_model_len = ns.context_length
    tensor_parallel(ns, argv, p)
    if not ns.served_model_name:
        ns.served_model_name = [config.model_name]
    if config.kv_events and ns.enable_prefix_caching is False:
        p.error("--kv-events needs prefix caching (drop --no-enable-prefix-caching, or pass --no-kv-events)")
    return AsyncEngineArgs.from_cli_args(ns)


def parse_args(argv: Sequence[str]) -> WorkerConfig:
    """Parse ``argv``; usage errors exit with status 2, as argparse does."""
    from .worker import VllmAdapter

    return parse_worker_args(VllmAdapter(), argv, PROG)

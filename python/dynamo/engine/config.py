"""The command line every engine worker shares: the engine's own parser with Dynamo's
flags added in their own groups, parsed into a :class:`WorkerConfig`.

Under ``dynamo serve`` the same flags arrive from YAML through
``ServiceConfig.as_args(...)`` (``enforce-eager: true`` → ``--enforce-eager``), so a
graph's configuration, ``--Worker.key=value`` overrides and a plain command line all
reach one parser; ``dynamo-run out=vllm`` passes ``--endpoint``, ``--model-path``,
``--model-name``, ``--context-length``, ``--kv-cache-block-size`` and
``--migration-limit`` (``DYN_VLLM_MODULE`` picks the module).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynamo.engine.adapter import EngineAdapter

DEFAULT_ENDPOINT = "dyn://dynamo.backend.generate"
#: Where a prefill worker serves unless told (where decode workers look by default).
DEFAULT_PREFILL_ENDPOINT = "dyn://dynamo.prefill.generate"


@dataclasses.dataclass
class WorkerConfig:
    """What a worker runs: Dynamo's settings and the engine's own arguments."""

    endpoint: str
    """``dyn://namespace.component.endpoint`` served by this worker."""
    model_name: str
    """The public model name (``model`` in OpenAI requests)."""
    model_path: str
    """What the engine loads (a folder or a HuggingFace id)."""
    migration_limit: int | None
    """Registered with the model when set; unset, each frontend's own ``--migration-limit``
    (default 3) applies."""
    role: str
    """``agg``, ``prefill`` or ``decode`` (docs/disagg.md)."""
    prefill_endpoint: str | None
    """Decode: the prefill workers' endpoint (default ``NAMESPACE.prefill.generate``)."""
    max_local_prefill_length: int
    max_prefill_queue_size: int
    remote_prefill_timeout: float
    max_concurrent_prefills: int
    kv_events: bool
    """Publish the engine's KV cache events (for ``--router-mode kv``)."""
    tool_call_parser: str | None
    """The model's tool-call parser (docs/tools.md), registered in its card."""
    reasoning_parser: str | None
    """The model's reasoning parser (docs/tools.md), registered in its card."""
    chat_template: str | None
    """A Jinja chat template file replacing the model's own, registered in its card."""
    kv_events_port: int
    metrics: bool
    """Publish the engine's load metrics."""
    engine_args: Any = None
    """The engine's own arguments (``AsyncEngineArgs``, ``ServerArgs``, ``LLM`` keyword arguments)."""


def parse_endpoint(endpoint: str) -> tuple[str, str, str]:
    """``(namespace, component, endpoint)`` of ``[dyn://]ns.component.endpoint``."""
    parts = endpoint.removeprefix("dyn://").split(".")
    if len(parts) != 3 or not all(parts):
        raise ValueError(f"{endpoint!r}: expected namespace.component.endpoint")
    return parts[0], parts[1], parts[2]


def add_arguments(parser: argparse.ArgumentParser, engine: str, own_flags: frozenset[str] = frozenset()) -> None:
    """Dynamo's flags for an ``engine`` worker, in their own groups; ``own_flags``: those
    the engine's parser defines already with the same meaning (left out here)."""
    from dynamo.llm import disagg

    group = parser.add_argument_group("Dynamo")

    def add(flag: str, **kwargs: Any) -> None:
        if flag not in own_flags:
            group.add_argument(flag, **kwargs)

    add(
        "--endpoint",
        help=f"where to serve (default {DEFAULT_ENDPOINT}; with --role prefill {DEFAULT_PREFILL_ENDPOINT})",
    )
    add("--model-path", help=f"the model {engine} loads")
    add("--model-name", help="the public model name (default: the engine's served name, else the model's folder name)")
    add("--kv-cache-block-size", type=int, help=f"tokens per KV block ({engine}'s own flag)")
    add("--context-length", type=int, help=f"the longest prompt + output ({engine}'s own flag)")
    add(
        "--migration-limit", type=int, default=None,
        help="times a frontend may continue a broken stream of this model on another worker, registered "
             "with the model (default: unset, the frontend's own --migration-limit, 3; 0: never)",
    )
    add_parser_arguments(parser.add_argument_group("Dynamo: output parsing (docs/tools.md)"))
    add(
        "--kv-events", action=argparse.BooleanOptionalAction, default=True,
        help=f"publish {engine}'s KV cache events on the event plane (default on)",
    )
    add(
        "--kv-events-port", type=int, default=0,
        help=f"TCP port of {engine}'s ZMQ event publisher (default 0: unset; vLLM then publishes on a private "
             "IPC socket, other engines on a free port)",
    )
    add(
        "--metrics", action=argparse.BooleanOptionalAction, default=True,
        help=f"publish {engine}'s load metrics (default on)",
    )
    disagg.add_arguments(
        parser.add_argument_group(
            "Dynamo: disaggregated serving",
            f"prefill and decode workers hand the prompt's KV over with {engine}'s own transfer; see docs/disagg.md "
            "and docs/engines.md",
        )
    )


def add_parser_arguments(group: Any) -> None:
    """vLLM's server flags for tool calls and reasoning (same names, so a ``vllm serve``
    command line carries over); unknown parser names are a usage error (exit 2) listing
    the known ones (``check_parser_names``). A flag the engine's own parser defines
    already (vLLM's engine ``--reasoning-parser``, SGLang's) is kept as the engine's."""
    from dynamo.llm import REASONING_PARSERS, TOOL_CALL_PARSERS

    flags: list[tuple[str, dict[str, Any]]] = [
        ("--tool-call-parser", {
            "metavar": "NAME",
            "help": f"parse tool calls out of the model's chat output ({', '.join(TOOL_CALL_PARSERS)})",
        }),
        ("--reasoning-parser", {
            "metavar": "NAME",
            "help": f"split the model's thinking into reasoning_content ({', '.join(REASONING_PARSERS)})",
        }),
        ("--chat-template", {"metavar": "FILE", "help": "a Jinja chat template file replacing the model's"}),
        ("--enable-auto-tool-choice", {
            "action": "store_true",
            "help": "accepted for vLLM command lines: tool_choice auto is served whenever --tool-call-parser is set",
        }),
    ]
    for flag, kwargs in flags:
        with contextlib.suppress(argparse.ArgumentError):
            group.add_argument(flag, **kwargs)


def check_parser_names(ns: argparse.Namespace, p: argparse.ArgumentParser) -> None:
    """Refuse parser names we do not know (exit 2, listing the known ones), also where
    the engine's own parser defined the flag without choices; an empty name is none."""
    from dynamo.llm import REASONING_PARSERS, TOOL_CALL_PARSERS

    for flag, known in (("tool_call_parser", TOOL_CALL_PARSERS), ("reasoning_parser", REASONING_PARSERS)):
        name = getattr(ns, flag, None) or None
        setattr(ns, flag, name)
        if name is not None and name not in known:
            p.error(f"--{flag.replace('_', '-')} {name!r}: unknown; known: {', '.join(known)}")
    template = getattr(ns, "chat_template", None)
    if template is not None and not Path(template).is_file():
        p.error(f"--chat-template {ns.chat_template!r}: no such file")


def new_parser(adapter: EngineAdapter, prog: str) -> argparse.ArgumentParser:
    """The engine's parser with Dynamo's groups."""
    p = adapter.parser(prog, f"Serve a {adapter.name} engine as a Dynamo token-level worker and register its model.")
    add_arguments(p, adapter.name, adapter.own_flags)
    return p


def parse_args(adapter: EngineAdapter, argv: Sequence[str], prog: str) -> WorkerConfig:
    """Parse ``argv``; usage errors exit with status 2, as argparse does."""
    argv = list(argv)
    p = new_parser(adapter, prog)
    ns = p.parse_args(argv)
    if ns.migration_limit is not None and ns.migration_limit < 0:
        p.error("--migration-limit must be at least 0")
    check_parser_names(ns, p)
    if ns.max_concurrent_prefills < 1 or ns.max_local_prefill_length < 0 or ns.max_prefill_queue_size < 0:
        p.error("--max-concurrent-prefills must be at least 1; the prefill thresholds at least 0")
    if not ns.remote_prefill_timeout > 0:
        p.error("--remote-prefill-timeout must be a positive number of seconds")
    if ns.role == "prefill":
        # A prefill worker's cache serves no router: its blocks leave with the transfer.
        ns.kv_events = False
    if ns.endpoint is None:
        ns.endpoint = DEFAULT_PREFILL_ENDPOINT if ns.role == "prefill" else DEFAULT_ENDPOINT
    endpoint = ns.endpoint if ns.endpoint.startswith("dyn://") else f"dyn://{ns.endpoint}"
    try:
        parse_endpoint(endpoint)
    except ValueError:
        p.error(f"--endpoint {ns.endpoint!r}: expected namespace.component.endpoint")
    model_path = adapter.model_path(ns)
    if not model_path:
        p.error("the model to load is required (--model-path)")
    model_name = ns.model_name or adapter.served_model_name(ns) or Path(str(model_path).rstrip("/")).name
    config = WorkerConfig(
        endpoint=endpoint,
        model_name=model_name,
        model_path=str(model_path),
        migration_limit=ns.migration_limit,
        role=ns.role,
        prefill_endpoint=ns.prefill_endpoint,
        max_local_prefill_length=ns.max_local_prefill_length,
        max_prefill_queue_size=ns.max_prefill_queue_size,
        remote_prefill_timeout=ns.remote_prefill_timeout,
        max_concurrent_prefills=ns.max_concurrent_prefills,
        kv_events=ns.kv_events,
        tool_call_parser=ns.tool_call_parser,
        reasoning_parser=ns.reasoning_parser,
        chat_template=getattr(ns, "chat_template", None),
        kv_events_port=ns.kv_events_port,
        metrics=ns.metrics,
    )
    config.engine_args = adapter.engine_args(ns, argv, p, config)
    return config

"""The Worker: an LLM engine serving token-level requests on ``{namespace}.Worker.generate``.

The engine is chosen by configuration (``engine: mocker``, ``vllm``, ``sglang`` or
``trtllm``: ``python -m dynamo.<engine>``, docs/engines.md); every other key of the
Worker's configuration becomes a flag of that engine's own argument parser, through
``ServiceConfig.as_args("Worker")`` (``speedup-ratio: 10`` → ``--speedup-ratio 10``).
The engine registers the model (kind ``backend``) so that the Processor and frontends
find its card.

    python -m components.worker -f configs/agg.yaml          # alone (from examples/llm)
    python -m components.worker --engine mocker --speedup-ratio 10
    dynamo serve graphs.agg:Frontend -f configs/agg.yaml     # started as `python -m components.worker`
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from dynamo.sdk import BaseDeployment, DynamoArgumentParser
from dynamo.sdk.lib.config import ServiceConfig

#: Engines the Worker can run, each ``python -m dynamo.<engine>`` (all but the mocker need
#: their engine's package; vllm, sglang and trtllm share the worker base, dynamo.engine).
ENGINES = ("mocker", "vllm", "sglang", "trtllm")
DEFAULT_ENGINE = "mocker"


class Worker(BaseDeployment):
    namespace = "dynamo"
    endpoints = ["generate"]
    resources = {"cpu": "1"}


def engine_argv(service_name: str, config: ServiceConfig) -> list[str]:
    """The service's configuration as the engine's flags (``engine`` itself left out)."""
    section = dict(config.get(service_name) or {})
    section.pop("engine", None)
    return ServiceConfig({**config, service_name: section}).as_args(service_name)


def parse_args(argv: Sequence[str] | None = None, service_name: str = Worker.name) -> tuple[str, list[str]]:
    """(engine, the engine's own flags) from the configuration and the command line."""
    parser = DynamoArgumentParser(
        service_name,
        prog="python -m components.worker",
        description="LLM worker; flags other than --engine and -f go to the engine's parser.",
    )
    parser.add_argument("--engine", choices=ENGINES, default=DEFAULT_ENGINE, help="the engine (default mocker)")
    args = parser.parse_args(argv)
    return args.engine, engine_argv(service_name, ServiceConfig.get_instance())


def run_engine(engine: str, argv: list[str]) -> int:
    """``python -m dynamo.<engine>`` in this process, with ``argv``; its exit status."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
    module = importlib.import_module(f"dynamo.{engine}.__main__")
    return int(module.main(argv))


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the configured engine until SIGINT/SIGTERM; returns the exit status."""
    engine, flags = parse_args(argv)
    deploy = Worker()
    endpoint = f"dyn://{deploy.namespace}.{deploy.name}.generate"
    if "--role" in flags and flags[flags.index("--role") + 1] == "decode" and "--prefill-endpoint" not in flags:
        # Disaggregated (`role: decode`): the graph's PrefillWorker takes the long prefills.
        from components.prefill_worker import endpoint as prefill_endpoint

        flags = [*flags, "--prefill-endpoint", prefill_endpoint()]
    # The engine's own parser validates the engine flags (an unknown key is a clear error).
    return run_engine(engine, ["--endpoint", endpoint, *flags])


if __name__ == "__main__":
    sys.exit(main())

"""Serve one service in this process: the shared entry of ``python -m dynamo.sdk.run``,
``run_component(Service)`` in a component's ``__main__``, and every process ``dynamo
serve`` starts."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from dynamo.sdk.lib.args import load_component_config
from dynamo.sdk.lib.config import ServiceConfigError
from dynamo.sdk.runner import serve_service
from dynamo.sdk.service import DynamoService


def _install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        return
    uvloop.install()


def run_component(service: DynamoService, argv: Sequence[str] | None = None) -> None:
    """Serve ``service`` in this process with configuration from the environment, ``-f``
    and flags (``sys.argv`` by default); exits with the service's status."""
    parser = argparse.ArgumentParser(prog=service.name)
    parser.add_argument("-f", "--config-file", default=None, help="YAML configuration file")
    known, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    sys.exit(serve(service, rest, known.config_file))


def serve(service: DynamoService, flags: Sequence[str], config_file: str | None) -> int:
    """Serve ``service`` with configuration flags ``flags``; returns the exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        graph = [s.name for s in service.all_services()]
        load_component_config(service.name, flags, config_file, graph)
        service.service_args()  # validate before starting anything
    except (ServiceConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    _install_uvloop()
    return asyncio.run(serve_service(service))



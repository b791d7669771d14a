"""Run one service on its own: ``python -m dynamo.sdk.run module:Service [flags]``, or
from a component's ``__main__`` with ``run_component(Service)``. ``dynamo serve`` starts
every process of a graph this same way.

Flags: ``-f config.yaml``, ``--service-name Name`` (a service of the graph other than the
root), ``--working-dir DIR``, and configuration flags (``--key value`` for the service's
own keys, ``--Other.key=value``, ``--ServiceArgs.dynamo.namespace=ns``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dynamo.sdk.deployment import BaseDeployment
from dynamo.sdk.loader import load_service
from dynamo.sdk.standalone import serve


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dynamo.sdk.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("service", help="module:Service")
    parser.add_argument("--service-name", default=None, help="run this service of the graph instead of the root")
    parser.add_argument("-f", "--config-file", default=None, help="YAML configuration file")
    parser.add_argument("--working-dir", default=".", help="directory to import the module from")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args, rest = _parser().parse_known_args(argv)
    try:
        root = load_service(args.service, args.working_dir)
        target: Any = root.find(args.service_name) if args.service_name else root
    except (ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    if isinstance(target, type) and issubclass(target, BaseDeployment):
        print(f"error: {target.name} is a BaseDeployment; run it with python -m {target.module()}", file=sys.stderr)
        sys.exit(2)
    sys.exit(serve(target, rest, args.config_file))


if __name__ == "__main__":
    main()

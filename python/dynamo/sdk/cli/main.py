"""``dynamo``: the command-line entry point (``dynamo serve``, ``dynamo build``,
``dynamo deploy``, ``dynamo run``, ``dynamo worker``)."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence

from dynamo.sdk.cli import build, deploy, serve, worker


def _run(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """``dynamo run ...`` is ``dynamo-run ...``."""
    binary = shutil.which("dynamo-run")
    if binary is None:
        print("dynamo run: the dynamo-run command is not installed", file=sys.stderr)
        return 2
    os.execv(binary, [binary, *args.args, *extra])
    return 0  # not reached


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="dynamo", description="Dynamo: serve LLMs across machines")
    from dynamo import __version__

    root.add_argument("--version", action="version", version=f"dynamo {__version__}")
    sub = root.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    build.add_parser(sub)
    deploy.add_parser(sub)
    worker.add_parser(sub)
    run = sub.add_parser("run", help="run dynamo-run with the remaining arguments", add_help=False)
    run.add_argument("args", nargs=argparse.REMAINDER)
    run.set_defaults(handler=_run, accepts_overrides=True)
    return root


def main(argv: Sequence[str] | None = None) -> None:
    args, extra = parser().parse_known_args(argv)
    if extra and not getattr(args, "accepts_overrides", False):
        parser().error(f"unrecognized arguments: {' '.join(extra)}")
    sys.exit(args.handler(args, extra))


if __name__ == "__main__":
    main()

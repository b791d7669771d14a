"""The ``dynamo-run`` console command: the Rust command line, run in this process."""

from __future__ import annotations

import sys

from dynamo._core import run_dynamo_run


def main() -> None:
    """Run ``dynamo-run`` with this process's arguments and exit with its status."""
    sys.exit(run_dynamo_run(sys.argv[1:]))

"""The ``dynamo-run`` console command: the Rust command line, run in this process."""

from __future__ import annotations

import os
import signal
import sys

from dynamo._core import run_dynamo_run


def main() -> None:
    """Run ``dynamo-run`` with this process's arguments and exit with its status."""
    # dynamo-run handles SIGINT and SIGTERM itself (graceful shutdown). Python's own SIGINT
    # handler would also fire and raise KeyboardInterrupt once the call returns.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    # out=vllm starts `python -m dynamo.vllm`: with this interpreter, which has dynamo.
    os.environ.setdefault("DYN_PYTHON", sys.executable)
    sys.exit(run_dynamo_run(sys.argv[1:]))

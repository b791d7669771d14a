"""Hello world end to end: start the worker as a subprocess, run the client against it,
then stop the worker with SIGTERM (graceful shutdown). Exits non-zero if anything fails.

    python examples/runtime/main.py
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from pathlib import Path

from client import DEFAULT_TEXT, say
from dynamo.runtime import DistributedRuntime, dynamo_worker

HERE = Path(__file__).resolve().parent
#: Seconds the worker may take to drain and exit after SIGTERM.
STOP_TIMEOUT = 15.0


def stop(worker: subprocess.Popen) -> int:
    """SIGTERM the worker and wait for it; SIGKILL if it does not exit in time."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"worker did not exit within {STOP_TIMEOUT:.0f}s of SIGTERM; killing it", file=sys.stderr)
            worker.kill()
            worker.wait()
            return 1
    return worker.returncode


@dynamo_worker()
async def run_client(runtime: DistributedRuntime) -> None:
    words = await say(runtime, DEFAULT_TEXT)
    if words != DEFAULT_TEXT.split():
        raise RuntimeError(f"expected the words {DEFAULT_TEXT.split()}, got {words}")


def run() -> int:
    worker = subprocess.Popen([sys.executable, str(HERE / "worker.py")])
    try:
        asyncio.run(run_client())
    except Exception as e:  # report and fail, but still stop the worker
        print(f"client failed: {type(e).__name__}: {e}", file=sys.stderr)
        stop(worker)
        return 1
    status = stop(worker)
    if status != 0:
        print(f"worker exited with status {status}", file=sys.stderr)
        return 1
    print("hello world: OK")
    return 0


if __name__ == "__main__":
    sys.exit(run())

"""The Frontend: the OpenAI HTTP frontend (``python -m dynamo.frontend``, the Rust HTTP
service) bound to the Processor's endpoint, run as a child process of this service and
stopped with it.

Configuration keys: ``port`` (default 8000), ``host`` (default 0.0.0.0), ``endpoint``
(default ``{Processor's namespace}.Processor.chat/completions``), ``router-mode``, the
admission limits ``max-inflight-requests``, ``max-queued-tokens`` and
``admission-ttft-ms``, and the ``/v1/responses`` store: ``responses-store``,
``responses-ttl-s``, ``responses-max`` (docs/responses.md).

    python -m components.frontend -f configs/agg.yaml   # alone (from examples/llm)
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

from dynamo.sdk import async_on_shutdown, async_on_start, depends, run_component, service
from dynamo.sdk.lib.config import ServiceConfig

from components.processor import ENDPOINT, Processor

logger = logging.getLogger("frontend")

DEFAULT_PORT = 8000
#: Admission limits, passed to the HTTP frontend as flags (docs/reliability.md).
ADMISSION_KEYS = ("max-inflight-requests", "max-queued-tokens", "admission-ttft-ms")
#: Seconds the HTTP frontend gets to drain after SIGTERM before SIGKILL.
STOP_GRACE = 20.0


def _die_with_parent() -> None:
    """In the child: SIGTERM when this service's process dies, even by SIGKILL (Linux)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@service(dynamo={"namespace": "dynamo"})
class Frontend:
    processor = depends(Processor)

    def __init__(self) -> None:
        config = ServiceConfig.get_parsed_config("Frontend")
        namespace, component = Processor.dynamo_address()
        self.endpoint = str(config.get("endpoint", f"{namespace}.{component}.{ENDPOINT}"))
        self.argv = [
            sys.executable, "-m", "dynamo.frontend",
            "--http-host", str(config.get("host", "0.0.0.0")),
            "--http-port", str(config.get("port", DEFAULT_PORT)),
            "--endpoint", self.endpoint,
        ]
        for key in ("router-mode", *ADMISSION_KEYS, "responses-store", "responses-ttl-s", "responses-max"):
            if key in config:
                self.argv += [f"--{key}", str(config[key])]
        self.process: asyncio.subprocess.Process | None = None
        self.stopping = False

    @async_on_start
    async def start(self) -> None:
        # This service's runtime serves the system port (DYN_SYSTEM_PORT); the HTTP
        # frontend answers its probes on its HTTP port, so it must not bind it too.
        env = {**os.environ, "DYN_SYSTEM_ENABLED": "false"}
        self.process = await asyncio.create_subprocess_exec(*self.argv, env=env, preexec_fn=_die_with_parent)
        self.watcher = asyncio.create_task(self.watch(self.process))
        logger.info("Frontend: HTTP frontend (pid %d) serving %s", self.process.pid, self.endpoint)

    async def watch(self, process: asyncio.subprocess.Process) -> None:
        status = await process.wait()
        if not self.stopping:
            # The HTTP frontend is this service: stop the service too; the shutdown hook
            # reports the failure (a non-zero exit status for dynamo serve).
            logger.error("Frontend: the HTTP frontend exited with status %s", status)
            os.kill(os.getpid(), signal.SIGTERM)

    @async_on_shutdown
    async def stop(self) -> None:
        failed = not self.stopping and self.process is not None and self.process.returncode is not None
        self.stopping = True
        process = self.process
        if failed and process is not None:
            raise RuntimeError(f"the HTTP frontend exited with status {process.returncode}")
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()


if __name__ == "__main__":
    run_component(Frontend)

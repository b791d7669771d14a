"""A small asyncio process supervisor: ``dynamo serve`` runs a service graph under it, and
``python -m dynamo.mocker --num-workers N`` its N workers.

Starts every child (argv + environment, with a label) in its own process group (within
this session, see ``_child_setup``), prefixes each output line with the child's label
(``Backend[1] | ...``), forwards SIGINT/SIGTERM to every child (then SIGKILL after a
bound), reaps them all, reports a child that exits with its status, restarts it when its
spec says so, and otherwise stops the others and exits non-zero.

Why not circus or supervisord: the needs are small (start, prefix, forward, reap,
restart), asyncio's subprocess support covers them in the standard library, and the
reference's use of circus is what the component proposal calls a source of pain.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: Seconds children get to exit after SIGTERM before they are killed, unless told otherwise.
DEFAULT_STOP_TIMEOUT = 30.0
#: Seconds between a child's exit and its restart.
RESTART_DELAY = 1.0


def _child_setup() -> None:
    """Runs in each child before exec.

    * Its own process group, so that stopping it stops what it started (an engine's
      core processes), but not its own *session*: Linux schedules each session as one
      group when ``kernel.sched_autogroup_enabled`` is on (most distributions' default),
      and a frontend alone in its session gets a sliver of a core that a CPU engine's
      session keeps busy. Its threads then wait 100+ ms for a core, and whole token
      streams reach the client at once (see docs/performance.md, "Real engine overhead").
    * ``PR_SET_PDEATHSIG``: a supervisor killed with SIGKILL cannot forward anything;
      the kernel does it.
    """
    os.setpgid(0, 0)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass(frozen=True)
class ChildSpec:
    """One child process to supervise."""

    #: Names the child in its output prefix (``label | ...``) and in reports.
    label: str
    argv: list[str]
    #: Added to this process's environment.
    env: dict[str, str] = field(default_factory=dict)
    #: ``on-failure`` restarts it after a non-zero exit, ``always`` after any exit,
    #: anything else (``never``) not at all.
    restart: str = "never"
    max_restarts: int = 0


@dataclass
class _Child:
    spec: ChildSpec
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0


class Supervisor:
    """Runs its children until they end, a signal arrives, or one fails.

    ``name`` prefixes the supervisor's own lines (``[name] ...``) and ``group`` names the
    children in its final report (``the graph failed: ...``); children run in
    ``working_dir`` (default: this process's) and get ``stop_timeout`` seconds after
    SIGTERM before SIGKILL."""

    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        name: str,
        group: str = "the children",
        working_dir: str | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
    ) -> None:
        self.children = [_Child(spec) for spec in children]
        self.name = name
        self.group = group
        self.working_dir = working_dir
        self.stopping = asyncio.Event()
        self.failed: list[str] = []
        self.stop_timeout = stop_timeout

    def _say(self, text: str) -> None:
        sys.stdout.write(f"[{self.name}] {text}\n")
        sys.stdout.flush()

    async def _start(self, child: _Child) -> None:
        child.proc = await asyncio.create_subprocess_exec(
            *child.spec.argv,
            env={**os.environ, **child.spec.env},
            cwd=self.working_dir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=_child_setup,
        )
        self._say(f"started {child.spec.label} (pid {child.proc.pid})")

    async def _pump(self, child: _Child, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        prefix = f"{child.spec.label} | ".encode()
        out = sys.stdout.buffer
        while line := await proc.stdout.readline():
            out.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
            out.flush()

    async def _watch(self, child: _Child) -> None:
        while True:
            proc = child.proc
            assert proc is not None
            await asyncio.gather(self._pump(child, proc), proc.wait())
            status = proc.returncode
            if self.stopping.is_set():
                return
            policy = child.spec.restart
            wants = policy == "always" or (policy == "on-failure" and status != 0)
            self._say(f"{child.spec.label} exited with status {status}")
            if wants and child.restarts < child.spec.max_restarts:
                child.restarts += 1
                self._say(f"restarting {child.spec.label} ({child.restarts}/{child.spec.max_restarts})")
                await asyncio.sleep(RESTART_DELAY)
                if self.stopping.is_set():
                    return
                await self._start(child)
                continue
            if status != 0 or wants:
                self.failed.append(f"{child.spec.label} exited with status {status}")
                self.stopping.set()
            return

    def _signal_all(self, sig: signal.Signals) -> None:
        for child in self.children:
            proc = child.proc
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)

    async def run(self) -> int:
        """Start every child and supervise them; the exit status: 1 when a child failed
        (or could not start), else 0."""
        loop = asyncio.get_running_loop()
        received: list[str] = []

        def on_signal(sig: signal.Signals) -> None:
            if received:
                self._say(f"{sig.name} again: killing every process")
                self._signal_all(signal.SIGKILL)
                return
            received.append(sig.name)
            self.stopping.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        watchers: list[asyncio.Task[None]] = []
        try:
            for child in self.children:
                await self._start(child)
                watchers.append(loop.create_task(self._watch(child)))
        except OSError as exc:
            self.failed.append(f"cannot start a process: {exc}")
            self.stopping.set()
        all_done = asyncio.gather(*watchers)
        stop_wait = loop.create_task(self.stopping.wait())
        first: list[asyncio.Future[Any]] = [all_done, stop_wait]
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if self.stopping.is_set():
            why = f"received {received[0]}" if received else "; ".join(self.failed)
            self._say(f"stopping every process ({why})")
            self._signal_all(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(all_done), self.stop_timeout)
            except asyncio.TimeoutError:
                self._say(f"processes still running after {self.stop_timeout:g}s: killing them")
                self._signal_all(signal.SIGKILL)
                await all_done
        for child in self.children:
            if child.proc is not None and child.proc.returncode is None:
                await child.proc.wait()
        if self.failed:
            self._say(f"{self.group} failed: " + "; ".join(self.failed))
            return 1
        return 0

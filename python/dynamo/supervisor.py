"""A small asyncio process supervisor: ``dynamo serve`` runs a service graph under it, and
``python -m dynamo.mocker --num-workers N`` its N workers.

Starts every child (argv + environment, with a label) in its own process group (within
this session, see ``child_setup``), prefixes each output line with the child's label
(``Backend[1] | ...``), forwards SIGINT/SIGTERM to every child (then SIGKILL after a
bound), reaps them all, reports a child that exits with its status, restarts it when its
spec says so, and otherwise stops the others and exits non-zero.

Readiness and rolling restart (the local twin of a Kubernetes rolling update, see
docs/reliability.md): a child whose spec sets ``probe`` is started with its runtime's
system server on a free loopback port that the supervisor picks at each start
(``DYN_SYSTEM_ENABLED=true``, ``DYN_SYSTEM_HOST=127.0.0.1``, ``DYN_SYSTEM_PORT``; a
``DYN_SYSTEM_PORT`` in the spec's own environment is kept instead), so its ``/ready``
can be probed on 127.0.0.1. On SIGHUP the supervisor replaces those children one at a
time: SIGTERM one (it drains: ``/ready`` turns 503, it leaves discovery, its in-flight
streams finish), wait for its exit (bounded by ``stop_timeout``), start its replacement,
wait for the replacement's ``/ready`` (bounded by ``ready_timeout``), then the next. So
with N such children of a service, never fewer than N-1 are routable.

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
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Seconds children get to exit after SIGTERM before they are killed, unless told otherwise.
DEFAULT_STOP_TIMEOUT = 30.0
#: Seconds between a child's exit and its restart.
RESTART_DELAY = 1.0
#: Seconds a replacement gets to answer ``/ready`` in a rolling restart, unless told otherwise.
DEFAULT_READY_TIMEOUT = 120.0
#: Seconds between two probes of a replacement's ``/ready``.
READY_POLL_INTERVAL = 0.2


def child_setup() -> None:
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
    #: A child with a runtime: started with its system server on a free loopback port
    #: (``/ready`` probed), and replaced in turn by a rolling restart (SIGHUP).
    probe: bool = False


@dataclass
class _Child:
    spec: ChildSpec
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    #: The system port of the running process (``probe`` children).
    port: int | None = None
    #: Set while a rolling restart replaces the process: its watcher waits for it.
    swap: asyncio.Event | None = None


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a child's system server)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ready_status(port: int) -> int:
    """The status ``/ready`` answers on ``port`` of 127.0.0.1 (0: no answer). Blocking:
    run it in a thread."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=1) as response:
            return int(response.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


async def pump_output(label: str, proc: asyncio.subprocess.Process) -> None:
    """Copy ``proc``'s output to this process's stdout, each line prefixed ``label | ``,
    until it closes."""
    assert proc.stdout is not None
    prefix = f"{label} | ".encode()
    out = sys.stdout.buffer
    while line := await proc.stdout.readline():
        out.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
        out.flush()


async def stop_group(proc: asyncio.subprocess.Process, timeout: float, say: Callable[[str], None]) -> int:
    """SIGTERM ``proc``'s process group (it drains), SIGKILL it after ``timeout``
    seconds (said through ``say``); returns its exit status."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        say(f"pid {proc.pid} still running after {timeout:g}s: killing it")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        return await proc.wait()


class Supervisor:
    """Runs its children until they end, a signal arrives, or one fails.

    ``name`` prefixes the supervisor's own lines (``[name] ...``) and ``group`` names the
    children in its final report (``the graph failed: ...``); children run in
    ``working_dir`` (default: this process's) and get ``stop_timeout`` seconds after
    SIGTERM before SIGKILL; in a rolling restart a replacement gets ``ready_timeout``
    seconds to answer ``/ready``."""

    def __init__(
        self,
        children: Sequence[ChildSpec],
        *,
        name: str,
        group: str = "the children",
        working_dir: str | None = None,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
    ) -> None:
        self.children = [_Child(spec) for spec in children]
        self.name = name
        self.group = group
        self.working_dir = working_dir
        self.stopping = asyncio.Event()
        self.failed: list[str] = []
        self.stop_timeout = stop_timeout
        self.ready_timeout = ready_timeout
        self._rolling: asyncio.Task[bool] | None = None

    def _say(self, text: str) -> None:
        sys.stdout.write(f"[{self.name}] {text}\n")
        sys.stdout.flush()

    async def _start(self, child: _Child) -> None:
        env = {**os.environ, **child.spec.env}
        if child.spec.probe:
            env["DYN_SYSTEM_ENABLED"] = "true"
            fixed = child.spec.env.get("DYN_SYSTEM_PORT", "0")
            if fixed != "0":
                child.port = int(fixed)  # the spec's own port (a service's `envs`): kept, probed there
            else:
                child.port = free_port()
                host = child.spec.env.get("DYN_SYSTEM_HOST", "127.0.0.1")
                env.update(DYN_SYSTEM_HOST=host, DYN_SYSTEM_PORT=str(child.port))
        child.proc = await asyncio.create_subprocess_exec(
            *child.spec.argv,
            env=env,
            cwd=self.working_dir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=child_setup,
        )
        port = f", system port {child.port}" if child.spec.probe else ""
        self._say(f"started {child.spec.label} (pid {child.proc.pid}{port})")


    async def _watch(self, child: _Child) -> None:
        while True:
            proc = child.proc
            assert proc is not None
            await asyncio.gather(pump_output(child.spec.label, proc), proc.wait())
            status = proc.returncode
            if child.swap is not None:
                # A rolling restart stopped it; follow its replacement, if one starts.
                await child.swap.wait()
                if child.proc is not proc and not self.stopping.is_set():
                    continue
                return
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

    async def _stop_one(self, proc: asyncio.subprocess.Process) -> int:
        """SIGTERM one child's process group, SIGKILL after ``stop_timeout``; its status."""
        return await stop_group(proc, self.stop_timeout, self._say)

    async def _wait_ready(self, child: _Child) -> bool:
        """Whether ``child`` answers ``/ready`` with 200 within ``ready_timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        proc, port = child.proc, child.port
        assert proc is not None and port is not None
        while loop.time() < deadline and not self.stopping.is_set():
            if proc.returncode is not None:
                return False
            if await asyncio.to_thread(ready_status, port) == 200:
                return True
            await asyncio.sleep(READY_POLL_INTERVAL)
        return False

    async def rolling_restart(self) -> bool:
        """Replace every ``probe`` child in turn: stop it (SIGTERM: it drains), start its
        replacement, wait until the replacement answers ``/ready``, then the next. Stops
        at the first replacement that is not ready in time (it keeps running; the
        supervisor reports it). Returns whether every child was replaced."""
        targets = [child for child in self.children if child.spec.probe]
        self._say(f"rolling restart of {len(targets)} processes")
        for child in targets:
            old = child.proc
            if self.stopping.is_set() or old is None or old.returncode is not None:
                self._say("rolling restart interrupted")
                return False
            child.swap = asyncio.Event()
            try:
                self._say(f"rolling restart: stopping {child.spec.label} (pid {old.pid}); it drains")
                status = await self._stop_one(old)
                self._say(f"rolling restart: {child.spec.label} exited with status {status}")
                if self.stopping.is_set():
                    return False
                await self._start(child)
            except OSError as exc:
                self.failed.append(f"cannot start {child.spec.label}: {exc}")
                self.stopping.set()
                return False
            finally:
                swap, child.swap = child.swap, None
                swap.set()
            if not await self._wait_ready(child):
                self._say(
                    f"rolling restart stopped: {child.spec.label} did not answer /ready within {self.ready_timeout:g}s"
                )
                return False
            self._say(f"rolling restart: {child.spec.label} ready (pid {child.proc.pid}, system port {child.port})")
        self._say("rolling restart done")
        return True

    def _on_hangup(self) -> None:
        if self.stopping.is_set():
            return
        if self._rolling is not None and not self._rolling.done():
            self._say("SIGHUP: a rolling restart is already running")
            return
        self._rolling = asyncio.get_running_loop().create_task(self.rolling_restart())

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
        loop.add_signal_handler(signal.SIGHUP, self._on_hangup)
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
        if self._rolling is not None:
            self._rolling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rolling
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

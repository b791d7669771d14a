"""A small asyncio process supervisor: ``dynamo serve`` runs a service graph under it, and
``python -m dynamo.mocker --num-workers N`` its N workers.

Starts every child (argv + environment, with a label) in its own process group (within
this session, see ``child_setup``), prefixes each output line with the child's label
(``Backend[1] | ...``), forwards SIGINT/SIGTERM to every child (then SIGKILL after a
bound), reaps them all, reports a child that exits with its status, restarts it when its
spec says so, and otherwise stops the others and exits non-zero.

SIGTERM goes to the child's own process, SIGKILL to its whole process group. A worker
drains on SIGTERM and then stops what it started; an engine process under it given
SIGTERM directly would stop at once (vLLM's engine core aborts its requests on it), so
the streams the worker was draining would fail. The group is what the bound's SIGKILL
takes, so nothing a child started outlives it. A child that is a wrapper script must
``exec`` the worker (as in a container, where SIGTERM reaches PID 1 only).

Readiness and rolling restart (the local twin of a Kubernetes rolling update, see
docs/reliability.md): a child whose spec sets ``probe`` is started with its runtime's
system server on a free loopback port that the child binds itself at each start
(``DYN_SYSTEM_ENABLED=true``, ``DYN_SYSTEM_HOST=127.0.0.1``, ``DYN_SYSTEM_PORT=0``) and
writes to a file the supervisor names (``DYN_SYSTEM_PORT_FILE``), so its ``/ready`` can
be probed on 127.0.0.1; a port picked here and bound later could be taken in between by
another process. A ``DYN_SYSTEM_PORT`` in the spec's own environment is kept instead. On
SIGHUP the supervisor replaces those children one at a time: SIGTERM one (it drains:
``/ready`` turns 503, it leaves discovery, its in-flight streams finish), wait for its
exit (bounded by its stop timeout: ``stop_bound``, its own drain bound plus a margin,
unless told otherwise), start its replacement, wait for the replacement's
``/ready`` (bounded by ``ready_timeout``), then the next. So with N such children of a
service, never fewer than N-1 are routable. A ``probe`` child counts as *ready*
(``Child.ready_at``) once its ``/ready`` answers 200 after a start.

A running supervisor also takes one more child (``add``, optionally after a start-up
delay) and drains one child while the others run (``stop_child``: SIGTERM, a bounded
wait, then SIGKILL; not restarted, not a failure). The planner's local connector uses it
that way, without ``run``: it adds and stops replicas and finally ``close``s it, and a
worker that dies by itself is reported without stopping the others
(``stop_all_on_failure=False``).

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
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import overload

from dynamo._core import ConfigError, drain_bound_s

#: The runtime's drain bound when a child's environment sets no ``DYN_SHUTDOWN_TIMEOUT``
#: (whole seconds, for the manifests' grace periods; ``lib/runtime``'s own default, which
#: ``drain_bound_s({})`` reads: tests/test_supervisor.py holds them equal).
DEFAULT_SHUTDOWN_TIMEOUT = 30
#: Slack between a child's drain bound and its SIGKILL (seconds): at its bound a worker
#: ends the streams still running as unavailable (a frontend's migration continues
#: them) and exits by itself, which a SIGKILL at the same instant would cut short.
KILL_MARGIN_SECONDS = 10
#: Seconds between a child's exit and its restart.
RESTART_DELAY = 1.0
#: Seconds a replacement gets to answer ``/ready`` in a rolling restart, unless told otherwise.
DEFAULT_READY_TIMEOUT = 120.0
#: Seconds between two probes of a child's ``/ready``.
READY_POLL_INTERVAL = 0.2
#: Environment variable: seconds children get to exit after SIGTERM before they are killed.
STOP_TIMEOUT_ENV = "DYN_SDK_STOP_TIMEOUT"
#: Environment variable: seconds a (re)started ``probe`` child gets to answer ``/ready``.
READY_TIMEOUT_ENV = "DYN_SDK_READY_TIMEOUT"


@overload
def seconds_from_env(name: str, default: float) -> float: ...
@overload
def seconds_from_env(name: str, default: None) -> float | None: ...
def seconds_from_env(name: str, default: float | None) -> float | None:
    """A bound in seconds from the environment variable ``name`` (``default`` when unset).

    Raises:
        ValueError: the value is not a number of seconds >= 0 (the message names ``name``).
    """
    raw = os.environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also refuses nan
        raise ValueError(f"{name} must be a number of seconds >= 0, got {raw!r}")
    return value


def stop_bound(env: dict[str, str]) -> float:
    """Seconds a child whose environment is ``env`` gets after SIGTERM before SIGKILL,
    unless told otherwise: its drain bound (``DYN_SHUTDOWN_TIMEOUT``, default
    ``DEFAULT_SHUTDOWN_TIMEOUT``) plus ``KILL_MARGIN_SECONDS`` (as the manifests' grace
    period, ``dynamo.sdk.deploy.lifecycle``), read by the runtime's own rule
    (``dynamo._core.drain_bound_s``). An environment the runtime would refuse falls back
    to the default: the child then fails at its start, not here."""
    try:
        bound = drain_bound_s(env)
    except ConfigError:
        bound = DEFAULT_SHUTDOWN_TIMEOUT
    return bound + KILL_MARGIN_SECONDS


def child_setup() -> None:
    """Runs in each child before exec.

    * Its own process group, so that killing it kills what it started (an engine's
      core processes; SIGTERM goes to the child alone, which stops them itself), but
      not its own *session*: Linux schedules each session as one
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
    #: that it reports in ``DYN_SYSTEM_PORT_FILE`` (``/ready`` probed there), and replaced
    #: in turn by a rolling restart (SIGHUP).
    probe: bool = False
    #: Seconds to hold the first start back (``Supervisor.add``; emulates a slow start).
    start_delay: float = 0.0


@dataclass(eq=False)
class Child:
    """One supervised child: its spec, its current process and its state (the handle
    ``Supervisor.add`` returns)."""

    spec: ChildSpec
    #: The running (or last) process; ``None`` before the first start.
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    #: The system port of the running process (``probe`` children; ``None`` until the
    #: process has written it to ``port_file``).
    port: int | None = None
    #: Where the running process writes its system port (``None``: the spec fixes it).
    port_file: Path | None = None
    #: When (``time.monotonic()``) the child was handed to the supervisor.
    created: float = field(default_factory=time.monotonic)
    #: When the current process first answered ``/ready`` 200 (``probe`` children).
    ready_at: float | None = None
    #: Set by ``stop_child``: its exit is neither restarted nor a failure.
    removing: bool = False
    #: Set while a rolling restart replaces the process: its watcher waits for it.
    swap: asyncio.Event | None = None
    #: The readiness wait of the current process (``probe`` children).
    readiness: asyncio.Task[bool] | None = None
    #: Starts (after ``start_delay``) and watches the child; done when it ended for good.
    task: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        """The child's label (its output prefix)."""
        return self.spec.label

    @property
    def ended(self) -> bool:
        """Whether the child ended for good (exited and not restarted, or stopped)."""
        return self.task is not None and self.task.done()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now (``""``: on every interface). Whoever binds
    it later can lose it to another process binding port 0 meanwhile: a child that can
    bind port 0 itself and report the port (``DYN_SYSTEM_PORT_FILE``) should."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def read_port(path: Path) -> int | None:
    """The port a child wrote to ``path`` (``DYN_SYSTEM_PORT_FILE``; ``None`` while absent,
    or while it holds no port number: a child that wrote it in place, not renamed in)."""
    try:
        port = int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return port if 0 < port < 65536 else None


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


def send(proc: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """``sig`` to a running child: SIGKILL to its whole process group, any other signal
    to its own process (it stops what it started; see the module's docstring)."""
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if sig == signal.SIGKILL:
            os.killpg(proc.pid, sig)
        else:
            os.kill(proc.pid, sig)


async def stop_process(proc: asyncio.subprocess.Process, timeout: float, say: Callable[[str], None]) -> int:
    """SIGTERM ``proc`` (it drains), SIGKILL its process group after ``timeout``
    seconds (said through ``say``); returns its exit status."""
    send(proc, signal.SIGTERM)
    try:
        return await asyncio.wait_for(proc.wait(), timeout)
    except asyncio.TimeoutError:
        say(f"pid {proc.pid} still running after {timeout:g}s: killing it")
        send(proc, signal.SIGKILL)
        return await proc.wait()


class Supervisor:
    """Runs its children until they end, a signal arrives, or one fails.

    ``name`` prefixes the supervisor's own lines (``[name] ...``) and ``group`` names the
    children in its final report (``the graph failed: ...``); children run in
    ``working_dir`` (default: this process's) and get ``stop_timeout`` seconds after
    SIGTERM before SIGKILL (``None``: each its own ``stop_bound``); a started ``probe``
    child gets ``ready_timeout`` seconds to answer ``/ready`` (in a rolling restart, the
    next child waits for it). With
    ``stop_all_on_failure`` (the default) a child that fails for good stops the others;
    without it the child is reported and dropped from ``children``."""

    def __init__(
        self,
        children: Sequence[ChildSpec] = (),
        *,
        name: str,
        group: str = "the children",
        working_dir: str | None = None,
        stop_timeout: float | None = None,
        ready_timeout: float = DEFAULT_READY_TIMEOUT,
        stop_all_on_failure: bool = True,
    ) -> None:
        self.children = [Child(spec) for spec in children]
        self.stop_all_on_failure = stop_all_on_failure
        self.name = name
        self.group = group
        self.working_dir = working_dir
        self.stopping = asyncio.Event()
        self.failed: list[str] = []
        self.stop_timeout = stop_timeout
        self.ready_timeout = ready_timeout
        self._rolling: asyncio.Task[bool] | None = None
        #: Holds the children's port files (made at the first probed start).
        self._port_dir: tempfile.TemporaryDirectory[str] | None = None
        self._starts = 0

    def _say(self, text: str) -> None:
        sys.stdout.write(f"[{self.name}] {text}\n")
        sys.stdout.flush()

    async def _start(self, child: Child) -> None:
        env = {**os.environ, **child.spec.env}
        env.pop("DYN_SYSTEM_PORT_FILE", None)  # one of this process's own, if any
        if child.spec.probe:
            env["DYN_SYSTEM_ENABLED"] = "true"
            fixed = child.spec.env.get("DYN_SYSTEM_PORT", "0")
            if fixed != "0":
                child.port, child.port_file = int(fixed), None  # the spec's own port (a service's `envs`): kept
            else:
                if self._port_dir is None:
                    self._port_dir = tempfile.TemporaryDirectory(prefix="dynamo-supervisor-")
                self._starts += 1
                child.port, child.port_file = None, Path(self._port_dir.name) / f"{self._starts}.port"
                host = child.spec.env.get("DYN_SYSTEM_HOST", "127.0.0.1")
                env.update(DYN_SYSTEM_HOST=host, DYN_SYSTEM_PORT="0", DYN_SYSTEM_PORT_FILE=str(child.port_file))
        child.proc = await asyncio.create_subprocess_exec(
            *child.spec.argv,
            env=env,
            cwd=self.working_dir,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=child_setup,
        )
        port = f", system port {child.port}" if child.port is not None and child.spec.probe else ""
        self._say(f"started {child.spec.label} (pid {child.proc.pid}{port})")
        child.ready_at = None
        if child.spec.probe:
            child.readiness = asyncio.get_running_loop().create_task(self._track_ready(child))

    async def _track_ready(self, child: Child) -> bool:
        """Wait (bounded) for the child's new process to answer ``/ready``; record and say
        it (nothing about a process that a restart has replaced meanwhile)."""
        proc = child.proc
        ready = await self._wait_ready(child)
        if child.proc is not proc:
            return ready
        if ready:
            child.ready_at = time.monotonic()
            self._say(f"{child.spec.label} ready")
        elif proc is not None and proc.returncode is None and not self.stopping.is_set():
            if child.port is None:
                self._say(f"{child.spec.label} did not write its system port (DYN_SYSTEM_PORT_FILE) "
                          f"within {self.ready_timeout:g}s")
            else:
                self._say(f"{child.spec.label} did not answer /ready within {self.ready_timeout:g}s")
        return ready

    async def _run_child(self, child: Child) -> None:
        """Start an added child (after its start delay) and watch it."""
        if child.spec.start_delay:
            await asyncio.sleep(child.spec.start_delay)
        try:
            await self._start(child)
        except OSError as exc:
            self._ended(child, f"cannot start {child.spec.label}: {exc}")
            return
        await self._watch(child)

    def _ended(self, child: Child, why: str) -> None:
        """A child ended for good by itself: a failure of the whole, or (without
        ``stop_all_on_failure``) reported and forgotten."""
        if self.stop_all_on_failure:
            self.failed.append(why)
            self.stopping.set()
            return
        self._say(f"{why}: not restarted")
        with contextlib.suppress(ValueError):
            self.children.remove(child)

    async def _watch(self, child: Child) -> None:
        while True:
            proc, readiness = child.proc, child.readiness
            assert proc is not None
            await asyncio.gather(pump_output(child.spec.label, proc), proc.wait())
            if readiness is not None:
                await readiness  # returns within one poll of the exit
            status = proc.returncode
            if child.swap is not None:
                # A rolling restart stopped it; follow its replacement, if one starts.
                await child.swap.wait()
                if child.proc is not proc and not self.stopping.is_set():
                    continue
                return
            if self.stopping.is_set() or child.removing:
                return
            policy = child.spec.restart
            wants = policy == "always" or (policy == "on-failure" and status != 0)
            self._say(f"{child.spec.label} exited with status {status}")
            if wants and child.restarts < child.spec.max_restarts:
                child.restarts += 1
                self._say(f"restarting {child.spec.label} ({child.restarts}/{child.spec.max_restarts})")
                await asyncio.sleep(RESTART_DELAY)
                if self.stopping.is_set() or child.removing:
                    return
                try:
                    await self._start(child)
                except OSError as exc:
                    self._ended(child, f"cannot restart {child.spec.label}: {exc}")
                    return
                continue
            if status != 0 or wants:
                self._ended(child, f"{child.spec.label} exited with status {status}")
            elif not self.stop_all_on_failure:
                with contextlib.suppress(ValueError):
                    self.children.remove(child)
            return

    def _signal_all(self, sig: signal.Signals) -> None:
        for child in self.children:
            if child.proc is not None:
                send(child.proc, sig)

    def _stop_timeout_of(self, child: Child) -> float:
        """Seconds ``child`` gets after SIGTERM before SIGKILL."""
        if self.stop_timeout is not None:
            return self.stop_timeout
        return stop_bound({**os.environ, **child.spec.env})

    async def _stop_one(self, child: Child, proc: asyncio.subprocess.Process) -> int:
        """SIGTERM one child, SIGKILL its process group after its stop timeout; its status."""
        return await stop_process(proc, self._stop_timeout_of(child), self._say)

    async def _wait_ready(self, child: Child) -> bool:
        """Whether ``child``'s current process answers ``/ready`` with 200 within ``ready_timeout``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout
        proc, port, port_file = child.proc, child.port, child.port_file
        assert proc is not None
        while loop.time() < deadline and not self.stopping.is_set():
            if proc.returncode is not None:
                return False
            if port is None and port_file is not None and (port := read_port(port_file)) is not None:
                child.port = port
                self._say(f"{child.spec.label} (pid {proc.pid}) has system port {port}")
            if port is not None and await asyncio.to_thread(ready_status, port) == 200:
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
                status = await self._stop_one(child, old)
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
            readiness = child.readiness
            assert readiness is not None
            if not await asyncio.shield(readiness):
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

    def add(self, spec: ChildSpec) -> Child:
        """Supervise one more child, started (after ``spec.start_delay``) while the others
        run; returns its handle at once (``proc`` is ``None`` until it starts). Needs a
        running event loop; the child lives until it ends, ``stop_child`` or ``close``."""
        child = Child(spec)
        self.children.append(child)
        child.task = asyncio.get_running_loop().create_task(self._run_child(child))
        return child

    async def stop_child(self, child: Child) -> int | None:
        """Drain one child while the others run: SIGTERM it, wait up to its stop timeout,
        then SIGKILL its process group. It is not restarted and its exit is no failure;
        one still in its start delay is never started. Returns its exit status (``None``
        when it never started)."""
        child.removing = True
        task = child.task
        if child.proc is None and task is not None:
            task.cancel()  # still in its start delay
            with contextlib.suppress(asyncio.CancelledError):
                await task
        status = None
        if child.proc is not None:
            status = await self._stop_one(child, child.proc)
            self._say(f"stopped {child.spec.label} (status {status})")
        if task is not None and not task.done():
            await task
        with contextlib.suppress(ValueError):
            self.children.remove(child)
        return status

    async def close(self) -> None:
        """Stop every child (SIGTERM; SIGKILL after the stop timeout) and reap them; for
        a supervisor used without ``run``."""
        self.stopping.set()
        await self._stop_all()

    async def _stop_all(self) -> None:
        """SIGTERM every child, SIGKILL those left after the longest stop timeout, reap them all
        (``stopping`` is set: nothing restarts)."""
        tasks = [child.task for child in self.children if child.task is not None]
        for child in self.children:
            if child.proc is None and child.task is not None:
                child.task.cancel()  # still in its start delay
        self._signal_all(signal.SIGTERM)
        all_done = asyncio.gather(*tasks, return_exceptions=True)
        bound = max((self._stop_timeout_of(child) for child in self.children), default=0.0)
        try:
            await asyncio.wait_for(asyncio.shield(all_done), bound)
        except asyncio.TimeoutError:
            self._say(f"processes still running after {bound:g}s: killing them")
            self._signal_all(signal.SIGKILL)
            await all_done
        for child in self.children:
            if child.proc is not None and child.proc.returncode is None:
                await child.proc.wait()
        if self._port_dir is not None:
            self._port_dir.cleanup()
            self._port_dir = None

    async def run(self) -> int:
        """Start every child and supervise them (children ``add``ed meanwhile too); the
        exit status: 1 when a child failed (or could not start), else 0."""
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
        try:
            for child in [child for child in self.children if child.task is None]:  # not the added ones
                await self._start(child)
                child.task = loop.create_task(self._watch(child))
        except OSError as exc:
            self.failed.append(f"cannot start a process: {exc}")
            self.stopping.set()
        stop_wait = loop.create_task(self.stopping.wait())
        while not self.stopping.is_set():
            live = [child.task for child in self.children if child.task is not None and not child.task.done()]
            if not live:
                break
            await asyncio.wait([stop_wait, *live], return_when=asyncio.FIRST_COMPLETED)
        stop_wait.cancel()
        if self._rolling is not None:
            self._rolling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._rolling
        if self.stopping.is_set():
            why = f"received {received[0]}" if received else "; ".join(self.failed)
            self._say(f"stopping every process ({why})")
        await self._stop_all()
        if self.failed:
            self._say(f"{self.group} failed: " + "; ".join(self.failed))
            return 1
        return 0

"""Helpers shared by the tests: free ports, bounded waits, worker subprocesses.

Everything here is bounded: a wait that runs out fails the test with what it was
waiting for and the worker's stderr, it never hangs.
"""

from __future__ import annotations

import asyncio
import ctypes
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
WORKERS_DIR = REPO_ROOT / "tests" / "workers"
EXAMPLES_DIR = REPO_ROOT / "examples"

#: Seconds (DYN_LEASE_TTL of every test); dead workers vanish from discovery after about this long.
LEASE_TTL = 2
#: Bound on a worker process starting and registering its instance.
READY_TIMEOUT = 30.0
#: Bound on reading one whole (small) response stream.
STREAM_TIMEOUT = 20.0

_PR_SET_PDEATHSIG = 1


#: The tests' own ports: below the kernel's ephemeral range (32768-60999 by default, see
#: /proc/sys/net/ipv4/ip_local_port_range), where a process that binds port 0 never lands,
#: split between the pytest-xdist workers (`PYTEST_XDIST_WORKER`, gw0, gw1, ...).
TEST_PORTS = range(20000, 32000)
_TEST_PORTS_PER_WORKER = 1500
_next_port = -1


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, for a process a test
    starts to bind. Handed out in turn from this xdist worker's share of `TEST_PORTS`: a
    port picked here and bound later by a child cannot be taken in between by another
    process binding port 0 (the kernel gives those from the ephemeral range), nor by
    another xdist worker (each has its own share), nor by the next test of this worker
    (its share is used round in turn before a port comes again)."""
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    first = TEST_PORTS.start + (index * _TEST_PORTS_PER_WORKER) % len(TEST_PORTS)
    if _next_port < 0:
        _next_port = os.getpid() % _TEST_PORTS_PER_WORKER  # a fresh run starts elsewhere in the share
    for _ in range(_TEST_PORTS_PER_WORKER):
        port = first + _next_port
        _next_port = (_next_port + 1) % _TEST_PORTS_PER_WORKER
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (a listener, or a connection still bound to it)
            return port
    raise RuntimeError(f"no free port in {first}..{first + _TEST_PORTS_PER_WORKER - 1} ({worker}'s test ports)")


def _die_with_parent() -> None:
    # If pytest itself is killed (or the hard timeout fires), children must not
    # outlive it. PDEATHSIG follows the forking *thread*, so Popen is only ever
    # called from the main thread.
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def spawn(
    argv: list[str], *, env: dict[str, str], stdout: Any, stderr: Any, cwd: Path | None = None
) -> subprocess.Popen:
    """Start a child process that dies with the test process."""
    assert threading.current_thread() is threading.main_thread(), "spawn from the main thread only"
    return subprocess.Popen(
        argv,
        env=env,
        stdout=stdout,
        stderr=stderr,
        stdin=subprocess.DEVNULL,
        cwd=str(cwd or REPO_ROOT),
        preexec_fn=_die_with_parent,
    )


def data_of(item: Any) -> Any:
    """The data of a response item (annotated or raw)."""
    return item.data() if hasattr(item, "data") and callable(item.data) else item


async def collect(stream: Any, timeout: float = STREAM_TIMEOUT) -> list[Any]:
    """Every item's data of `stream`, in order; fails if the stream takes longer than `timeout`."""

    async def run() -> list[Any]:
        return [data_of(item) async for item in stream]

    return await asyncio.wait_for(run(), timeout)


async def request(client: Any, body: Any, timeout: float = STREAM_TIMEOUT, **kwargs: Any) -> list[Any]:
    """Send `body` with `client.generate` and collect the whole stream."""

    async def run() -> list[Any]:
        stream = await client.generate(body, **kwargs)
        return [data_of(item) async for item in stream]

    return await asyncio.wait_for(run(), timeout)


T = TypeVar("T")


def _timed_out(timeout: float, what: str | Callable[[], str]) -> NoReturn:
    description = what() if callable(what) else what
    pytest.fail(f"timed out after {timeout:.1f}s waiting for {description}")


async def wait_until(
    predicate: Callable[[], T | Awaitable[T]],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `predicate` (a function, or an async one) until it returns a true value, and
    return that value; fail after `timeout` seconds naming `what` (a string, or a function
    giving one at the moment of failure). An exception of a type in `ignore` counts as
    "not yet"; any other ends the wait (a predicate may `pytest.fail` when what it waits
    on can no longer happen, e.g. the process exited). The one poll loop of the tests:
    write a predicate for the observable state, never a `deadline` loop or a sleep."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return typing.cast(T, value)
        except ignore:
            pass
        if time.monotonic() >= deadline:
            _timed_out(timeout, what)
        await asyncio.sleep(interval)


def wait_until_blocking(
    predicate: Callable[[], T],
    timeout: float,
    what: str | Callable[[], str],
    interval: float = 0.05,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """`wait_until` for code that runs outside the event loop (fixtures, threads): the
    same rules, blocking the calling thread between polls."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
            if value:
                return value
        except ignore:
            pass
        if time.monotonic() >= deadline:
            _timed_out(timeout, what)
        time.sleep(interval)


async def wait_for_instances(client: Any, count: int, timeout: float = READY_TIMEOUT) -> list[int]:
    """Wait until `client` sees at least `count` instances; returns their ids."""
    await asyncio.wait_for(client.wait_for_instances(), timeout)
    await wait_until(
        lambda: len(client.instance_ids()) >= count,
        timeout,
        lambda: f"{count} instances (have {client.instance_ids()})",
    )
    return list(client.instance_ids())


async def instance_counts_during(client: Any, awaitable: Awaitable[Any], interval: float = 0.02) -> list[int]:
    """How many instances `client` saw, sampled every `interval` seconds while
    `awaitable` ran (a rolling restart, a scale-down); the samples, once it is done."""
    counts: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            counts.append(len(client.instance_ids()))
            await asyncio.sleep(interval)

    sampling = asyncio.create_task(sample())
    try:
        await awaitable
    finally:
        done.set()
        await sampling
    return counts


async def bounded(awaitable: Awaitable[Any], timeout: float, what: str) -> Any:
    """Await with a bound; fail the test (not just raise TimeoutError) naming `what`."""
    try:
        return await asyncio.wait_for(awaitable, timeout)
    except asyncio.TimeoutError:
        pytest.fail(f"timed out after {timeout:.1f}s: {what}")


async def shutdown_runtime(rt: Any, timeout: float = 20.0) -> None:
    """Shut `rt` down and wait (bounded) until it has closed."""
    pending = rt.shutdown()
    if pending is not None and hasattr(pending, "__await__"):
        await asyncio.wait_for(pending, timeout)
    await asyncio.wait_for(rt.closed(), timeout)


class WorkerProcess:
    """A Python script run as a child process, its stdout read line by line.

    Worker scripts print `READY <instance_id>` once their endpoint is registered and
    other report lines (e.g. `DONE ...`) that tests wait for.
    """

    def __init__(
        self,
        script: Path,
        args: list[str],
        env: dict[str, str],
        log_dir: Path,
        name: str,
        argv: list[str] | None = None,
        cwd: Path | None = None,
    ):
        self.script = script
        self.name = name
        self.stderr_path = log_dir / f"{name}.stderr"
        self._stderr = open(self.stderr_path, "w")
        self.lines: list[str] = []
        self._lock = threading.Lock()
        self.instance_id: int | None = None
        self.proc = spawn(
            argv if argv is not None else [sys.executable, "-u", str(script), *args],
            env={**env, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            cwd=cwd,
        )
        self._reader = threading.Thread(target=self._read, name=f"stdout-{name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            with self._lock:
                self.lines.append(line)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def stderr_tail(self, limit: int = 4000) -> str:
        try:
            self._stderr.flush()
            return self.stderr_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def describe(self) -> str:
        return (
            f"worker {self.name} (pid {self.pid}, exit {self.proc.poll()})\n"
            f"--- stdout ---\n{self.stdout()[-2000:]}\n--- stderr ---\n{self.stderr_tail()}"
        )

    def find_lines(self, prefix: str) -> list[str]:
        with self._lock:
            return [line for line in self.lines if line.startswith(prefix)]

    async def wait_for_line(self, prefix: str, timeout: float) -> str:
        """The first stdout line starting with `prefix`; fails after `timeout` or if the process ends first."""

        def found() -> str | None:
            lines = self.find_lines(prefix)
            if lines:
                return lines[0]
            if self.proc.poll() is not None and not self._reader.is_alive():
                pytest.fail(f"{self.name} exited before printing '{prefix}...'\n{self.describe()}")
            return None

        return await wait_until(
            found, timeout, lambda: f"{self.name} to print '{prefix}...'\n{self.describe()}", interval=0.02
        )

    async def wait_ready(self, timeout: float = READY_TIMEOUT) -> int:
        """Wait for `READY <instance_id>`; returns the instance id."""
        line = await self.wait_for_line("READY", timeout)
        parts = line.split()
        self.instance_id = int(parts[1]) if len(parts) > 1 else None
        return self.instance_id  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL and reap."""
        self.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    async def wait_exit(self, timeout: float) -> int:
        """The exit status; fails if the process still runs after `timeout`."""
        await wait_until(
            lambda: self.proc.poll() is not None, timeout, lambda: f"{self.name} to exit\n{self.describe()}"
        )
        return self.proc.returncode

    def terminate(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds; always reaps."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(timeout=2)
        self._stderr.close()


def started_pids(proc: WorkerProcess, supervisor: str) -> dict[str, int]:
    """`label → pid` from a `dynamo.supervisor` run's `[supervisor] started X (pid N…)` lines
    (the latest start of each label)."""
    pids = {}
    for line in proc.find_lines(f"[{supervisor}] started"):
        match = re.search(r"started (\S+) \(pid (\d+)[,)]", line)
        if match:
            pids[match.group(1)] = int(match.group(2))
    return pids


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (a reaped child does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


class WorkerPool:
    """Starts worker scripts for one test and stops all of them at teardown."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.started: list[WorkerProcess] = []

    def spawn(self, script: str | Path, *args: str, env: dict[str, str] | None = None) -> WorkerProcess:
        """Start `script` (a name under tests/workers/, or a path) without waiting."""
        path = Path(script)
        if not path.is_absolute():
            path = (WORKERS_DIR / path) if (WORKERS_DIR / path).exists() else (REPO_ROOT / path)
        name = f"{path.stem}-{len(self.started)}"
        worker = WorkerProcess(path, list(args), env if env is not None else self.env, self.log_dir, name)
        self.started.append(worker)
        return worker

    def command(
        self, argv: list[str], *, name: str, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> WorkerProcess:
        """Start any command (e.g. `dynamo serve ...`) with the same bookkeeping."""
        worker = WorkerProcess(
            Path(argv[0]), [], env if env is not None else self.env, self.log_dir,
            f"{name}-{len(self.started)}", argv=argv, cwd=cwd,
        )
        self.started.append(worker)
        return worker

    async def start(self, script: str | Path, *args: str, env: dict[str, str] | None = None,
                    timeout: float = READY_TIMEOUT) -> WorkerProcess:
        """Start `script` and wait until it printed READY."""
        worker = self.spawn(script, *args, env=env)
        await worker.wait_ready(timeout)
        return worker

    def stop_all(self) -> None:
        for worker in self.started:
            worker.terminate()


def backend_overrides(name: str, request: pytest.FixtureRequest, kv_dir: Path) -> dict[str, str]:
    """The runtime settings of backend `name`: `embedded` (file discovery in `kv_dir`, TCP
    planes) or `etcd_nats` (the session's etcd and NATS servers, started on demand)."""
    common = {
        "DYN_LEASE_TTL": str(LEASE_TTL),
        "DYN_SHUTDOWN_TIMEOUT": "10",
        "DYN_TCP_HOST": "127.0.0.1",
    }
    if name == "embedded":
        return {
            **common,
            "DYN_DISCOVERY_BACKEND": "file",
            "DYN_FILE_KV": str(kv_dir),
            "DYN_REQUEST_PLANE": "tcp",
            "DYN_EVENT_PLANE": "tcp",
        }
    if name == "etcd_nats":
        etcd = request.getfixturevalue("etcd_server")
        nats = request.getfixturevalue("nats_server")
        return {
            **common,
            "DYN_DISCOVERY_BACKEND": "etcd",
            "ETCD_ENDPOINTS": etcd.url,
            "NATS_SERVER": nats.url,
            "DYN_REQUEST_PLANE": "nats",
            "DYN_EVENT_PLANE": "nats",
        }
    raise ValueError(f"unknown backend {name!r}")

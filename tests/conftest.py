"""Fixtures: real etcd and nats-server processes, the two backend configurations,
worker subprocesses, an in-process runtime, and a per-test time bound.

Backends (the `backend` fixture, parametrized):

- `embedded`: file discovery in a fresh directory, TCP request and event planes.
- `etcd_nats`: etcd discovery, NATS request and event planes, against servers this
  session starts on free loopback ports.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import shutil
import signal
import socket
import subprocess
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import WorkerPool, backend_overrides, free_port, shutdown_runtime, spawn, wait_until_blocking

#: Seconds a test (setup + call + teardown) may take unless marked `@pytest.mark.timeout(n)`.
DEFAULT_TEST_TIMEOUT = 90
#: Bound on a server process accepting connections.
SERVER_START_TIMEOUT = 10.0

#: Environment keys the runtime reads; cleared before each test so the host's
#: environment cannot leak into a test (DYN_LOG excepted).
RUNTIME_ENV_PREFIXES = ("DYN_",)
RUNTIME_ENV_KEYS = ("ETCD_ENDPOINTS", "NATS_SERVER")

BACKENDS = ["embedded", "etcd_nats"]
#: Runtime log filter of test processes unless DYN_LOG is set (worker logs go to files
#: shown when a test fails; the test process's own go to the terminal).
DEFAULT_LOG_FILTER = "warn"


# --------------------------------------------------------------------------- pytest-xdist

#: The fault suite's rows that pytest-xdist workers ran (tests/faults/conftest.py), printed
#: by this process, the controller.
_WORKER_FAULT_ROWS: list[dict[str, Any]] = []


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    _WORKER_FAULT_ROWS.extend(getattr(node, "workeroutput", {}).get("fault_reports", []))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _WORKER_FAULT_ROWS:
        from faults.load import print_reliability

        print_reliability(terminalreporter, _WORKER_FAULT_ROWS)


# --------------------------------------------------------------------------- time bound


class TimeBoundExceeded(Exception):
    """Raised in the main thread when a test runs past its bound."""


def _test_timeout(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        return float(marker.args[0])
    return float(DEFAULT_TEST_TIMEOUT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    """Bound every test: SIGALRM raises in the test after its timeout; if even that does
    not get it unstuck, faulthandler dumps every thread and ends the session (the
    children die with it: see helpers.spawn)."""
    timeout = _test_timeout(item)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeBoundExceeded(f"{item.nodeid} ran longer than {timeout:.0f}s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    faulthandler.dump_traceback_later(timeout + 30, exit=True)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------- servers


def _binary(name: str, fallbacks: list[str]) -> str:
    found = shutil.which(name)
    if found:
        return found
    for path in fallbacks:
        if os.access(path, os.X_OK):
            return path
    pytest.fail(
        f"'{name}' is not installed (looked on PATH and in {fallbacks}); the distributed-backend "
        f"tests need it. Install it (Debian/Ubuntu: apt-get install etcd-server nats-server) — "
        f".ci/run does this."
    )


def _wait_for_server(proc: subprocess.Popen, log: Path, what: str, ready: Any) -> None:
    last_error: Exception | None = None

    def accepting() -> bool:
        nonlocal last_error
        if proc.poll() is not None:
            pytest.fail(f"{what} exited with {proc.returncode} at start:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            return bool(ready())
        except OSError as e:
            last_error = e
            return False

    try:
        wait_until_blocking(
            accepting, SERVER_START_TIMEOUT,
            lambda: f"{what} to accept connections ({last_error}):\n{log.read_text(errors='replace')[-3000:]}",
        )
    except BaseException:
        proc.kill()
        raise


def _stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@dataclass
class Server:
    """A server process this session started."""

    url: str
    port: int
    proc: subprocess.Popen


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real etcd on a free loopback port with a temporary data directory."""
    binary = _binary("etcd", ["/usr/bin/etcd", "/usr/local/bin/etcd"])
    base = tmp_path_factory.mktemp("etcd")
    client_port, peer_port = free_port(), free_port()
    client_url, peer_url = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    log = base / "etcd.log"
    with open(log, "w") as out:
        proc = spawn(
            [
                binary,
                "--name", "dynamo-test",
                "--data-dir", str(base / "data"),
                "--listen-client-urls", client_url,
                "--advertise-client-urls", client_url,
                "--listen-peer-urls", peer_url,
                "--initial-advertise-peer-urls", peer_url,
                "--initial-cluster", f"dynamo-test={peer_url}",
                "--log-level", "warn",
            ],
            env=dict(os.environ),
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def ready() -> bool:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as response:
            return response.status == 200 and b"true" in response.read()

    _wait_for_server(proc, log, f"etcd ({binary})", ready)
    yield Server(client_url, client_port, proc)
    _stop_server(proc)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real nats-server on a free loopback port, with JetStream (the disaggregated
    prefill queue uses it)."""
    binary = _binary("nats-server", ["/usr/sbin/nats-server", "/usr/bin/nats-server", "/usr/local/bin/nats-server"])
    base = tmp_path_factory.mktemp("nats")
    port = free_port()
    log = base / "nats.log"
    with open(log, "w") as out:
        argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(base / "jetstream")]
        proc = spawn(argv, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"INFO")

    _wait_for_server(proc, log, f"nats-server ({binary})", ready)
    yield Server(f"nats://127.0.0.1:{port}", port, proc)
    _stop_server(proc)


# --------------------------------------------------------------------------- backends


class BackendEnv(dict):
    """The whole environment for a process of this test (os.environ with the backend's
    settings); `name` says which backend, `overrides` holds only the runtime's keys."""

    def __init__(self, name: str, env: dict[str, str], overrides: dict[str, str]):
        super().__init__(env)
        self.name = name
        self.overrides = overrides

    def with_(self, **extra: str) -> dict[str, str]:
        """A copy with extra variables, for one subprocess."""
        return {**self, **extra}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> BackendEnv:
    """The runtime environment of one backend, applied to os.environ for in-process
    runtimes and returned (as a full environment) for subprocesses."""
    log_filter = os.environ.get("DYN_LOG") or DEFAULT_LOG_FILTER
    for key in list(os.environ):
        if key.startswith(RUNTIME_ENV_PREFIXES) or key in RUNTIME_ENV_KEYS:
            monkeypatch.delenv(key)
    monkeypatch.setenv("DYN_LOG", log_filter)
    kv_dir = tmp_path / "kv"
    kv_dir.mkdir()
    overrides = backend_overrides(request.param, request, kv_dir)
    for key, value in overrides.items():
        monkeypatch.setenv(key, value)
    return BackendEnv(request.param, dict(os.environ), overrides)


@pytest.fixture
def namespace() -> str:
    """A namespace of this test alone (etcd and NATS are shared by the session)."""
    return f"test_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def workers(backend: BackendEnv, tmp_path: Path) -> Iterator[WorkerPool]:
    """Start worker scripts (tests/workers/*.py or examples) in the backend's environment;
    all of them are stopped (SIGTERM, then SIGKILL) at teardown."""
    logs = tmp_path / "logs"
    logs.mkdir()
    pool = WorkerPool(dict(backend), logs)
    yield pool
    pool.stop_all()


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """A small HuggingFace-style model folder (word-level tokenizer) the mocker serves."""
    from llm_helpers import write_model_dir

    return write_model_dir(tmp_path / "models")


@pytest.fixture
def workers_local(tmp_path: Path) -> Iterator[WorkerPool]:
    """Like `workers`, for processes that need no discovery (a frontend with a local
    engine, batch runs): not parametrized by backend, the runtime's settings removed."""
    from llm_helpers import local_env

    logs = tmp_path / "logs"
    logs.mkdir()
    pool = WorkerPool(local_env(), logs)
    yield pool
    pool.stop_all()


@pytest.fixture
async def runtime(backend: BackendEnv) -> AsyncIterator[Any]:
    """A DistributedRuntime in this process, configured from the backend's environment."""
    from dynamo.runtime import DistributedRuntime

    rt = DistributedRuntime(asyncio.get_running_loop(), False)
    yield rt
    await shutdown_runtime(rt)

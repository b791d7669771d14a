"""A small fleet for fault tests: an HTTP frontend (`dynamo-run in=http out=dyn`),
mocker workers (`python -m dynamo.mocker`), and, for the distributed backend, an etcd
and a nats-server of this test alone that the test may kill and start again on the
same port and data directory.

Liveness bounds are shortened through configuration (`FAST_BOUNDS`) so that a fault
is detected in seconds; the mechanisms are the production ones.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import LEASE_TTL, WorkerPool, WorkerProcess, free_port, spawn, wait_until, wait_until_blocking
from llm_helpers import DYNAMO_RUN, MOCKER, Frontend, write_json

#: Shorter liveness bounds for the suite (seconds). See docs/architecture.md for the defaults.
FAST_BOUNDS = {
    "DYN_LEASE_TTL": str(LEASE_TTL),
    "DYN_TCP_PING_INTERVAL": "0.5",
    "DYN_TCP_PEER_TIMEOUT": "2",
    "DYN_STREAM_FIRST_ITEM_TIMEOUT": "20",
    "DYN_STREAM_ITEM_TIMEOUT": "5",
    "DYN_SHUTDOWN_TIMEOUT": "10",
    "DYN_TCP_HOST": "127.0.0.1",
}
#: Mocker timing: a 24-token request takes a few hundred milliseconds, so faults hit
#: streams in flight.
MOCKER_SETTINGS = {"speedup_ratio": 0.5}
SERVER_START_TIMEOUT = 15.0


def _binary(name: str, fallbacks: list[str]) -> str:
    found = shutil.which(name) or next((p for p in fallbacks if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.fail(f"'{name}' is not installed; the fault suite needs it (.ci/run installs it)")
    return found


class Server:
    """A server process that can be killed and started again with the same arguments."""

    def __init__(self, name: str, argv: list[str], log: Path, ready: Callable[[], bool]):
        self.name = name
        self.argv = argv
        self.log = log
        self.ready = ready
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "a") as out:
            self.proc = spawn(self.argv, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
        proc = self.proc

        def started() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"{self.name} exited at start:\n{self.log.read_text(errors='replace')[-3000:]}")
            return self.ready()

        wait_until_blocking(started, SERVER_START_TIMEOUT, f"{self.name} to start", ignore=(OSError,))

    def kill(self) -> None:
        """SIGKILL and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


def etcd_server(base: Path) -> tuple[Server, str]:
    binary = _binary("etcd", ["/usr/bin/etcd", "/usr/local/bin/etcd"])
    client_port, peer_port = free_port(), free_port()
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    argv = [
        binary, "--name", "faults", "--data-dir", str(base / "etcd-data"),
        "--listen-client-urls", client, "--advertise-client-urls", client,
        "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
        "--initial-cluster", f"faults={peer}", "--log-level", "warn",
    ]

    def ready() -> bool:
        with urllib.request.urlopen(f"{client}/health", timeout=1) as response:
            return response.status == 200 and b"true" in response.read()

    return Server("etcd", argv, base / "etcd.log", ready), client


def nats_server(base: Path) -> tuple[Server, str]:
    binary = _binary("nats-server", ["/usr/sbin/nats-server", "/usr/bin/nats-server"])
    port = free_port()

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"INFO")

    return Server("nats-server", [binary, "-a", "127.0.0.1", "-p", str(port)], base / "nats.log", ready), f"nats://127.0.0.1:{port}"


class Fleet:
    """The processes of one fault test, all stopped at teardown."""

    def __init__(self, backend: str, base: Path, model_dir: Path, namespace: str):
        self.backend = backend
        self.base = base
        self.model_dir = model_dir
        self.model = model_dir.name
        self.endpoint = f"{namespace}.mocker.generate"
        self.etcd: Server | None = None
        self.nats: Server | None = None
        env = {k: v for k, v in os.environ.items()
               if not k.startswith("DYN_") and k not in ("ETCD_ENDPOINTS", "NATS_SERVER")}
        env.update(FAST_BOUNDS)
        env["DYN_LOG"] = os.environ.get("DYN_LOG", "warn")
        if backend == "embedded":
            kv = base / "kv"
            kv.mkdir()
            env.update({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv),
                        "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "tcp"})
        else:
            self.etcd, etcd_url = etcd_server(base)
            self.nats, nats_url = nats_server(base)
            self.etcd.start()
            self.nats.start()
            env.update({"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": etcd_url, "NATS_SERVER": nats_url,
                        "DYN_REQUEST_PLANE": "nats", "DYN_EVENT_PLANE": "nats"})
        self.env = env
        logs = base / "logs"
        logs.mkdir()
        self.pool = WorkerPool(env, logs)
        self.settings = write_json(base / "mocker.json", MOCKER_SETTINGS)
        self.workers: list[WorkerProcess] = []
        self.frontend: Frontend | None = None

    def start_worker(
        self, *args: str, prefix: tuple[str, ...] = (), env: dict[str, str] | None = None
    ) -> WorkerProcess:
        """A mocker worker; `prefix` wraps the command (e.g. `ip netns exec NS`), `env`
        adds variables."""
        argv = [*prefix, *MOCKER, "--model-path", str(self.model_dir), "--endpoint", self.endpoint,
                "--extra-engine-args", str(self.settings), *args]
        worker = self.pool.command(argv, name="mocker", env={**self.env, **(env or {})})
        self.workers.append(worker)
        return worker

    async def start_workers(self, count: int, *args: str, env: dict[str, str] | None = None) -> list[WorkerProcess]:
        started = [self.start_worker(*args, env=env) for _ in range(count)]
        for w in started:
            await w.wait_for_line("dynamo-run: serving model", 30)
        return started

    def start_echo_worker(self, model: str, env: dict[str, str] | None = None) -> WorkerProcess:
        """A chat-level worker (`dynamo-run in=dyn://… out=echo_full`) registering `model`
        as a `chat` model: the frontend sends it OpenAI requests, not tokens."""
        namespace = self.endpoint.split(".")[0]
        argv = [*DYNAMO_RUN, f"in=dyn://{namespace}.echo.generate", "out=echo_full", "--model-name", model]
        worker = self.pool.command(argv, name="echo", env={**self.env, **(env or {})})
        self.workers.append(worker)
        return worker

    async def start_probed_workers(self, count: int) -> list[tuple[WorkerProcess, int]]:
        """`count` mocker workers, each with its system server (`/ready`) on a port of its own."""
        started = []
        for _ in range(count):
            port = free_port()
            env = {"DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port)}
            started.append((self.start_worker(env=env), port))
        for w, _ in started:
            await w.wait_for_line("dynamo-run: serving model", 30)
        return started

    async def start_supervised_workers(self, count: int) -> WorkerProcess:
        """`python -m dynamo.mocker --num-workers COUNT`: the workers under the process
        supervisor, which gives each a system port (see `supervised_ports`) and replaces
        them in turn on SIGHUP."""
        argv = [*MOCKER, "--model-path", str(self.model_dir), "--endpoint", self.endpoint,
                "--extra-engine-args", str(self.settings), "--num-workers", str(count)]
        supervisor = self.pool.command(argv, name="mocker-supervisor", env=self.env)
        self.workers.append(supervisor)

        def serving() -> bool:
            serving = sum("dynamo-run: serving model" in line for line in supervisor.find_lines("mocker["))
            return serving >= count and len(supervised_ports(supervisor)) >= count

        await wait_until(serving, 30, lambda: f"{count} supervised workers to serve\n{supervisor.describe()}")
        return supervisor

    async def start_frontend(
        self, *args: str, port: int | None = None, env: dict[str, str] | None = None, models: list[str] | None = None
    ) -> Frontend:
        """`dynamo-run in=http out=dyn`, once it lists `models` (default: the mocker's)."""
        port = port or free_port()
        argv = [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port), "--http-host", "127.0.0.1", *args]
        self.frontend = Frontend(self.pool.command(argv, name="frontend", env={**self.env, **(env or {})}), port)
        await self.frontend.wait_live()
        await self.frontend.wait_models(models or [self.model])
        return self.frontend

    def stop(self) -> None:
        self.pool.stop_all()
        for server in (self.etcd, self.nats):
            if server is not None:
                server.stop()


def supervised_ports(supervisor: WorkerProcess) -> dict[str, int]:
    """The system port of each supervised child's latest process that reported one (the
    supervisor says `NAME (pid N) has system port P` once the process has bound it)."""
    ports: dict[str, int] = {}
    for line in supervisor.find_lines("[mocker] "):
        found = re.match(r"\[mocker\] (\S+) \(pid \d+\) has system port (\d+)$", line)
        if found:
            ports[found.group(1)] = int(found.group(2))
    return ports


def is_ready(port: int, tries: int = 3) -> bool:
    """Whether `/ready` on `port` answers 200: a 503 or a refused connection is "not ready"
    at once; an answer slower than 2 s is asked again, up to `tries` times in all (a
    Kubernetes readiness probe's failure threshold, 3 by default, does the same), so a
    loaded machine's slow answer is not mistaken for a worker that is out."""
    for _ in range(tries):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as response:
                return response.status == 200
        except urllib.error.HTTPError:
            return False
        except TimeoutError:
            continue
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                continue
            return False
        except OSError:
            return False
    return False


def freeze(worker: WorkerProcess) -> None:
    worker.send_signal(signal.SIGSTOP)


def thaw(worker: WorkerProcess) -> None:
    worker.send_signal(signal.SIGCONT)

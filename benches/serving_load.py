"""What the serving benchmarks share: child processes (started as ``dynamo.supervisor``
starts its children: in their own process group, killed with it, dying with this process), a minimal keep-alive HTTP/1.1 + SSE
client that times each streamed event, closed-loop and open-loop (Poisson) load, and
percentiles. Used by ``llm_serving.py``, ``disagg.py`` and ``engine_overhead.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The supervisor's primitives: a process group of its own within this session (why: see
# child_setup), dying with this process; a free loopback port.
from dynamo.supervisor import child_setup, free_port

#: Bound on one request (s).
REQUEST_TIMEOUT = 60.0

# ----------------------------------------------------------------------------- processes


class Processes:
    """Child processes of one scenario, their logs in `log_dir`. Each child leads its own
    process group, so stopping it also stops what it spawned (vLLM's engine core)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 (closed with the process)
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=child_setup)
        log.close()
        self.started.append((name, proc))
        return proc

    def log_tail(self, name: str, chars: int = 3000) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")[-chars:]

    def check(self) -> None:
        for name, proc in self.started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}")

    def _signal_group(self, proc: subprocess.Popen[bytes], sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to every child's group, then SIGKILL to the groups still there after
        `grace` seconds (newest first: frontends before workers, workers before etcd)."""
        for _, proc in reversed(self.started):
            self._signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for _, proc in reversed(self.started):
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            # Whatever the leader left behind in its group goes too.
            self._signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        self.started.clear()


def wait_until(what: str, ready: Callable[[], bool], processes: Processes, timeout: float) -> None:
    """Poll `ready()` (OSError counts as not ready) until true; fail when a child exits
    or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        processes.check()
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} was not ready within {timeout:.0f}s (logs in {processes.log_dir})")


def listed_models(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2) as r:
        return sorted(m["id"] for m in json.load(r)["data"])


def wait_for_models(port: int, models: list[str], processes: Processes, timeout: float = 60.0) -> None:
    wait_until(f"the server on port {port} listing {models}",
               lambda: all(m in listed_models(port) for m in models), processes, timeout)


def start_etcd(processes: Processes, base: Path, timeout: float = 30.0) -> str:
    """A real etcd on free loopback ports (data in `base`); its client URL."""
    binary = "/usr/bin/etcd" if Path("/usr/bin/etcd").exists() else "etcd"
    client_url, peer_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    processes.start("etcd", [
        binary, "--name", "bench", "--data-dir", str(base / "etcd-data"),
        "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
        "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"bench={peer_url}", "--log-level", "warn",
    ], dict(os.environ))

    def ready() -> bool:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as r:
            return r.status == 200 and b"true" in r.read()

    wait_until("etcd", ready, processes, timeout)
    return client_url


def start_nats(processes: Processes, base: Path, timeout: float = 30.0) -> str:
    """A real nats-server with JetStream on a free loopback port; its URL."""
    binary = "/usr/sbin/nats-server" if Path("/usr/sbin/nats-server").exists() else "nats-server"
    port = free_port()
    processes.start("nats", [binary, "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(base / "jetstream")],
                    dict(os.environ))

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"INFO")

    wait_until("nats-server", ready, processes, timeout)
    return f"nats://127.0.0.1:{port}"


# ----------------------------------------------------------------------------- client


@dataclass
class Sample:
    """One completed stream."""

    ttft: float
    gaps: list[float]
    #: Events with content.
    tokens: int
    #: `usage.completion_tokens` of the stream's usage chunk, when the server sent one.
    completion_tokens: int | None = None
    #: From the first to the last event with content (s).
    decode: float = 0.0

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (s): `decode` over the tokens after the
        first (by usage when given, else by events); None for a one-token stream."""
        tokens = self.completion_tokens if self.completion_tokens is not None else self.tokens
        return self.decode / (tokens - 1) if tokens > 1 else None


class Connection:
    """One keep-alive HTTP/1.1 connection posting streaming requests."""

    def __init__(self, port: int):
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self.reader, self.writer

    @property
    def is_open(self) -> bool:
        return self.writer is not None

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None

    async def chat(self, body: bytes) -> Sample:
        return await self.stream("/v1/chat/completions", body)

    async def stream(self, path: str, body: bytes, *, count_empty: bool = False) -> Sample:
        """POST `body` to `path` (chat or completions, ``"stream": true``) and time its
        events: an event counts as a token when its first choice has content (chat's
        ``delta.content``, completions' ``text``) or, with `count_empty`, when it has a
        choice that does not finish the stream (a token whose text the detokenizer holds
        back, e.g. part of a UTF-8 character). A kept-alive connection the server closed
        while idle is reopened once."""
        start = time.perf_counter()
        request = (b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                   b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(body), body))
        reused = self.is_open
        reader, writer = await self._open()
        writer.write(request)
        try:
            status = await reader.readline()
        except ConnectionError:
            status = b""
        if not status and reused:
            await self.close()
            start = time.perf_counter()
            reader, writer = await self._open()
            writer.write(request)
            status = await reader.readline()
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"status {status!r}")
        chunked = False
        keep_alive = True
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
            if name.lower() == "connection" and "close" in value.lower():
                keep_alive = False
        times: list[float] = []
        pending = b""
        done = False
        usage_tokens: int | None = None
        #: When the first event with a choice came (its text may be empty).
        first_choice: list[float] = []

        def events(data: bytes) -> None:
            nonlocal pending, done, usage_tokens
            pending += data
            while b"\n\n" in pending:
                event, pending = pending.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    done = True
                    continue
                chunk = json.loads(payload)
                choices = chunk.get("choices") or []
                if choices and not first_choice:
                    first_choice.append(time.perf_counter())
                if choices and (choices[0].get("delta", {}).get("content") or choices[0].get("text")
                                or (count_empty and choices[0].get("finish_reason") is None)):
                    times.append(time.perf_counter())
                usage = chunk.get("usage")
                if usage and usage.get("completion_tokens") is not None:
                    usage_tokens = int(usage["completion_tokens"])

        if chunked:
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                events((await reader.readexactly(size + 2))[:-2])
        else:
            events(await reader.read())
            keep_alive = False
        if not keep_alive:
            await self.close()
        if done and not times and first_choice and usage_tokens:
            # Every token's text held back to the end (byte tokens that never made a
            # character), and the server sent no event for them: the stream's first event
            # is its first token as the client sees it.
            times = first_choice[:1]
        if not done or not times:
            raise RuntimeError(f"the stream ended without [DONE] or without content ({len(times)} events with "
                               f"content, [DONE] {'seen' if done else 'not seen'}, usage {usage_tokens}, "
                               f"last bytes {pending[-200:]!r})")
        return Sample(times[0] - start, [b - a for a, b in itertools.pairwise(times)], len(times), usage_tokens,
                      times[-1] - times[0])


#: What a failed request can raise.
REQUEST_ERRORS = (OSError, RuntimeError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError)


def percentile(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run_async(coro: Any) -> Any:
    try:
        import uvloop

        return uvloop.run(coro)
    except ImportError:
        return asyncio.run(coro)


# ----------------------------------------------------------------------------- open loop


@dataclass
class OpenLoopResult:
    """The figures of one open-loop run: `requests` sent at Poisson arrivals of `rate`
    per second (``inf``: all at once)."""

    rate: float
    requests: int
    completed: int = 0
    errors: int = 0
    #: From the first send to the last stream's end.
    seconds: float = 0.0
    output_tokens: int = 0
    #: Events with content over all completed streams.
    events: int = 0
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    first_error: str | None = None

    def summary(self) -> dict[str, Any]:
        secs = self.seconds or float("nan")
        return {
            "rate": self.rate,
            "requests": self.requests,
            "completed": self.completed,
            "errors": self.errors,
            "seconds": self.seconds,
            "req_per_s": self.completed / secs,
            "output_tok_per_s": self.output_tokens / secs,
            "ttft_p50_ms": percentile(self.ttft, 50) * 1000,
            "ttft_p99_ms": percentile(self.ttft, 99) * 1000,
            "itl_p50_ms": percentile(self.gaps, 50) * 1000,
            "itl_p99_ms": percentile(self.gaps, 99) * 1000,
            "tpot_p50_ms": percentile(self.tpot, 50) * 1000,
            "tokens_per_event": self.output_tokens / self.events if self.events else float("nan"),
        }


def poisson_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Send times (s from the start) of `count` Poisson arrivals at `rate` per second;
    all 0 for an infinite rate."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(count):
        out.append(t)
        t += rng.expovariate(rate)
    return out


async def open_loop(port: int, path: str, bodies: list[bytes], rate: float, *, seed: int = 0,
                    timeout: float = REQUEST_TIMEOUT, count_empty: bool = True) -> OpenLoopResult:
    """Send each of `bodies` at its Poisson arrival time, whether or not earlier requests
    have finished (open loop). Idle keep-alive connections are reused; a request that
    finds none opens one. `count_empty`: as `Connection.stream` (by default every token
    event counts, whether or not its text is empty)."""
    result = OpenLoopResult(rate, len(bodies))
    idle: list[Connection] = []
    offsets = poisson_offsets(len(bodies), rate, seed)
    start = time.perf_counter()
    ends: list[float] = []

    async def one(body: bytes, at: float) -> None:
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        conn = idle.pop() if idle else Connection(port)
        try:
            sample = await asyncio.wait_for(conn.stream(path, body, count_empty=count_empty), timeout)
        except REQUEST_ERRORS as e:
            result.errors += 1
            result.first_error = result.first_error or repr(e)
            await conn.close()
            return
        finally:
            ends.append(time.perf_counter())
        if conn.is_open:
            idle.append(conn)
        result.completed += 1
        result.output_tokens += sample.completion_tokens if sample.completion_tokens is not None else sample.tokens
        result.events += sample.tokens
        result.ttft.append(sample.ttft)
        result.gaps.extend(sample.gaps)
        if sample.tpot is not None:
            result.tpot.append(sample.tpot)

    try:
        await asyncio.gather(*(one(b, at) for b, at in zip(bodies, offsets, strict=True)))
    finally:
        for conn in idle:
            await conn.close()
    result.seconds = (max(ends) if ends else time.perf_counter()) - start
    if result.first_error:
        print(f"  first error: {result.first_error}", file=sys.stderr)
    return result

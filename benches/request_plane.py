"""Request-plane benchmark: a worker process and a client process on loopback.

    python benches/request_plane.py                  # embedded + etcd/NATS, default asyncio loop
    python benches/request_plane.py --baseline       # ... plus a bare asyncio echo for comparison
    python benches/request_plane.py --uvloop         # ... plus the same with uvloop in both processes
    python benches/request_plane.py --backends embedded --json /tmp/out.json
    python benches/request_plane.py --repeat 3       # medians of 3 runs (about 80 s per backend)

Backends:

* ``embedded``: ``DYN_DISCOVERY_BACKEND=file`` (fresh ``DYN_FILE_KV`` temp dir),
  ``DYN_REQUEST_PLANE=tcp``, ``DYN_EVENT_PLANE=tcp``.
* ``etcd_nats``: a real etcd and nats-server started here on free loopback ports;
  ``DYN_DISCOVERY_BACKEND=etcd``, ``DYN_REQUEST_PLANE=nats``, ``DYN_EVENT_PLANE=nats``.
* ``baseline`` (``--baseline``): no Dynamo at all. One TCP connection, length-prefixed
  frames multiplexed by stream id, an asyncio server whose handler is the same async
  generator. What plain asyncio costs for the same shapes.

The worker's handler yields ``N`` integers for request ``N``. The client measures:

* sequential round trip of a 1-item request (``annotated=False``), p50/p99, and p50 with
  the default ``annotated=True``;
* requests/s of 1-item requests with 64 and 256 asyncio tasks each looping requests for a
  fixed time (and the p50 latency under that load);
* items/s of one 20,000-item stream;
* items/s of 100 concurrent 200-item streams.

Everything is bounded (``--timeout``, default 170 s for the whole run); every child process
(workers, clients, etcd, nats-server) is killed on exit, and dies with this process if it
is killed (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import math
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()

# ----------------------------------------------------------------------------- shapes

WARMUP_REQUESTS = 300
RTT_REQUESTS = 2000
RTT_ANNOTATED_REQUESTS = 1000
CONCURRENCY = (64, 256)
CONCURRENCY_SECONDS = 3.0
ONE_STREAM_ITEMS = 20_000
MANY_STREAMS = 100
MANY_STREAM_ITEMS = 200

#: Targets for comparison (see docs/performance.md).
TARGETS = {
    "rtt_p50_us": 300.0,
    "rps_64": 12_000.0,
    "stream_items_s": 60_000.0,
}


async def generate(n: int) -> AsyncIterator[int]:
    """The worker's handler: yields ``n`` integers."""
    for i in range(n):
        yield i


# ----------------------------------------------------------------------------- helpers


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100.0 * (len(sorted_values) - 1))))
    return sorted_values[k]


def new_loop(use_uvloop: bool) -> asyncio.AbstractEventLoop:
    if use_uvloop:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run_main(coro_fn: Callable[[], Any], use_uvloop: bool) -> Any:
    loop = new_loop(use_uvloop)
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(coro_fn())
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


# ----------------------------------------------------------------------------- measurements
#
# `call(n)` is an async function returning an async iterator over the n items of one
# request; the same measurement code drives Dynamo and the baseline.


async def consume(call: Callable[[int], Any], n: int) -> int:
    got = 0
    async for _ in await call(n):
        got += 1
    if got != n:
        raise RuntimeError(f"asked for {n} items, got {got}")
    return got


async def measure_rtt(call: Callable[[int], Any], count: int) -> dict[str, float]:
    lat: list[float] = []
    clock = time.perf_counter
    for _ in range(count):
        t0 = clock()
        async for _ in await call(1):
            pass
        lat.append((clock() - t0) * 1e6)
    lat.sort()
    return {
        "p50_us": percentile(lat, 50),
        "p99_us": percentile(lat, 99),
        "mean_us": sum(lat) / len(lat),
    }


async def measure_concurrency(call: Callable[[int], Any], in_flight: int, seconds: float) -> dict[str, float]:
    clock = time.perf_counter
    deadline = clock() + seconds
    lat: list[float] = []
    errors = 0

    async def loop_requests() -> int:
        nonlocal errors
        done = 0
        while clock() < deadline:
            t0 = clock()
            try:
                async for _ in await call(1):
                    pass
            except Exception:
                errors += 1
                continue
            lat.append((clock() - t0) * 1e6)
            done += 1
        return done

    start = clock()
    counts = await asyncio.gather(*(loop_requests() for _ in range(in_flight)))
    elapsed = clock() - start
    lat.sort()
    return {
        "rps": sum(counts) / elapsed,
        "p50_us": percentile(lat, 50),
        "p99_us": percentile(lat, 99),
        "errors": errors,
    }


async def measure_one_stream(call: Callable[[int], Any], items: int) -> dict[str, float]:
    t0 = time.perf_counter()
    await consume(call, items)
    elapsed = time.perf_counter() - t0
    return {"items_s": items / elapsed, "seconds": elapsed}


async def measure_many_streams(call: Callable[[int], Any], streams: int, items: int) -> dict[str, float]:
    t0 = time.perf_counter()
    await asyncio.gather(*(consume(call, items) for _ in range(streams)))
    elapsed = time.perf_counter() - t0
    return {"items_s": streams * items / elapsed, "seconds": elapsed}


async def measure_all(call: Callable[[int], Any], annotated_call: Callable[[int], Any] | None, quick: bool) -> dict[str, Any]:
    scale = 0.25 if quick else 1.0
    out: dict[str, Any] = {}
    for _ in range(WARMUP_REQUESTS):
        await consume(call, 1)
    await asyncio.gather(*(consume(call, 10) for _ in range(64)))
    await consume(call, 2000)
    out["rtt"] = await measure_rtt(call, int(RTT_REQUESTS * scale))
    if annotated_call is not None:
        for _ in range(50):
            await consume(annotated_call, 1)
        out["rtt_annotated"] = await measure_rtt(annotated_call, int(RTT_ANNOTATED_REQUESTS * scale))
    for c in CONCURRENCY:
        out[f"conc_{c}"] = await measure_concurrency(call, c, CONCURRENCY_SECONDS * scale)
    out["one_stream"] = await measure_one_stream(call, ONE_STREAM_ITEMS)
    out["many_streams"] = await measure_many_streams(call, MANY_STREAMS, MANY_STREAM_ITEMS)
    return out


# ----------------------------------------------------------------------------- Dynamo roles


def dynamo_worker_main(args: argparse.Namespace) -> None:
    from dynamo.runtime import dynamo_worker

    @dynamo_worker()
    async def worker(runtime: Any) -> None:
        endpoint = runtime.namespace("bench").component("worker").endpoint("generate")
        print("worker serving", flush=True)
        await endpoint.serve_endpoint(generate)

    run_main(worker, args.uvloop)


def dynamo_client_main(args: argparse.Namespace) -> None:
    from dynamo.runtime import DistributedRuntime

    async def client_main() -> dict[str, Any]:
        rt = DistributedRuntime(asyncio.get_running_loop(), False)
        try:
            endpoint = rt.namespace("bench").component("worker").endpoint("generate")
            client = await endpoint.client()
            await client.wait_for_instances(timeout=30)

            async def raw(n: int) -> Any:
                return await client.generate(n, annotated=False)

            async def annotated(n: int) -> Any:
                return await client.generate(n)

            return await measure_all(raw, annotated, args.quick)
        finally:
            await rt.shutdown()

    result = run_main(client_main, args.uvloop)
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- baseline roles
#
# Frames: u32 length of the rest, u64 stream id, u8 kind (1 request, 2 item, 3 end),
# JSON body. Requests and responses of many streams share the one connection.

_HEAD = struct.Struct("!IQB")
REQUEST, ITEM, END = 1, 2, 3


def _frame(stream: int, kind: int, body: bytes) -> bytes:
    return _HEAD.pack(9 + len(body), stream, kind) + body


async def _read_frames(reader: asyncio.StreamReader, on_frame: Callable[[int, int, bytes], None]) -> None:
    size = _HEAD.size
    try:
        while True:
            head = await reader.readexactly(size)
            length, stream, kind = _HEAD.unpack(head)
            body = await reader.readexactly(length - 9) if length > 9 else b""
            on_frame(stream, kind, body)
    except (asyncio.IncompleteReadError, ConnectionError):
        return


def baseline_worker_main(args: argparse.Namespace) -> None:
    async def serve() -> None:
        async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            async def respond(stream: int, body: bytes) -> None:
                n = json.loads(body)
                async for item in generate(n):
                    writer.write(_frame(stream, ITEM, json.dumps(item).encode()))
                    if writer.transport.get_write_buffer_size() > 256 * 1024:
                        await writer.drain()
                writer.write(_frame(stream, END, b""))

            tasks: set[asyncio.Task] = set()

            def on_frame(stream: int, kind: int, body: bytes) -> None:
                if kind == REQUEST:
                    t = asyncio.get_running_loop().create_task(respond(stream, body))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)

            await _read_frames(reader, on_frame)
            writer.close()

        server = await asyncio.start_server(on_connection, "127.0.0.1", args.port)
        print("worker serving", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        async with server:
            await stop.wait()

    run_main(serve, args.uvloop)


class _BaselineStream:
    """Async iterator over the items of one baseline stream."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()

    def __aiter__(self) -> _BaselineStream:
        return self

    async def __anext__(self) -> Any:
        kind, body = await self.queue.get()
        if kind == END:
            raise StopAsyncIteration
        return json.loads(body)


def baseline_client_main(args: argparse.Namespace) -> None:
    async def client_main() -> dict[str, Any]:
        for _ in range(300):
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        else:
            raise RuntimeError("baseline worker did not start")
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        streams: dict[int, _BaselineStream] = {}
        next_id = 0

        def on_frame(stream: int, kind: int, body: bytes) -> None:
            s = streams.get(stream)
            if s is None:
                return
            if kind == END:
                del streams[stream]
            s.queue.put_nowait((kind, body))

        read_task = asyncio.get_running_loop().create_task(_read_frames(reader, on_frame))

        async def call(n: int) -> _BaselineStream:
            nonlocal next_id
            next_id += 1
            s = _BaselineStream()
            streams[next_id] = s
            writer.write(_frame(next_id, REQUEST, json.dumps(n).encode()))
            return s

        try:
            return await measure_all(call, None, args.quick)
        finally:
            read_task.cancel()
            writer.close()

    result = run_main(client_main, args.uvloop)
    print("RESULT " + json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- orchestration


class Children:
    """Every process this run started; all are killed on exit."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen] = []

    def spawn(self, argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        """Start `argv` with stdout and stderr going to `log`. Main thread only (PDEATHSIG)."""
        with open(log, "w") as out:
            proc = subprocess.Popen(
                argv,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent,
                cwd=str(HERE.parent.parent),
            )
        self.procs.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
        if proc.poll() is not None:
            return
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        except ProcessLookupError:
            pass

    def kill_all(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    proc.kill()
                    proc.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass


def _wait_until(what: str, ready: Callable[[], bool], proc: subprocess.Popen, log: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text(errors='replace')[-2000:]}")
        try:
            if ready():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not become ready within {timeout}s:\n{log.read_text(errors='replace')[-2000:]}")


def start_etcd(children: Children, base: Path) -> str:
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    client_url, peer_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    log = base / "etcd.log"
    proc = children.spawn(
        [
            binary, "--name", "bench", "--data-dir", str(base / "etcd-data"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"bench={peer_url}", "--log-level", "warn",
        ],
        dict(os.environ),
        log=log,
    )

    def ready() -> bool:
        with urllib.request.urlopen(f"{client_url}/health", timeout=1) as r:
            return r.status == 200 and b"true" in r.read()

    _wait_until("etcd", ready, proc, log)
    return client_url


def start_nats(children: Children, base: Path) -> str:
    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    log = base / "nats.log"
    proc = children.spawn([binary, "-a", "127.0.0.1", "-p", str(port)], dict(os.environ), log=log)

    def ready() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.settimeout(1)
            return s.recv(4).startswith(b"INFO")

    _wait_until("nats-server", ready, proc, log)
    return f"nats://127.0.0.1:{port}"


def run_case(children: Children, name: str, uvloop: bool, env: dict[str, str], base: Path, args: argparse.Namespace, deadline: float) -> dict[str, Any]:
    """Start a worker, run a client to completion, stop the worker; the client's result."""
    extra = ["--uvloop"] if uvloop else []
    if args.quick:
        extra.append("--quick")
    tag = f"{name}{'-uvloop' if uvloop else ''}"
    worker_role, client_role = ("baseline-worker", "baseline-client") if name == "baseline" else ("worker", "client")
    if name == "baseline":
        extra += ["--port", str(free_port())]
    worker_log = base / f"{tag}-worker.log"
    worker = children.spawn([sys.executable, str(HERE), "--role", worker_role, *extra], env, log=worker_log)
    try:
        _wait_until(f"{tag} worker", lambda: "worker serving" in worker_log.read_text(errors="replace"), worker, worker_log)
        client_log = base / f"{tag}-client.log"
        with open(client_log, "w") as err:
            client = subprocess.Popen(
                [sys.executable, str(HERE), "--role", client_role, *extra],
                env=env, stdout=subprocess.PIPE, stderr=err, text=True,
                preexec_fn=_die_with_parent,
                cwd=str(HERE.parent.parent),
            )
            children.procs.append(client)
            try:
                out, _ = client.communicate(timeout=max(5.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait(timeout=5)
                raise RuntimeError(f"{tag}: client ran past the time bound") from None
        if client.returncode != 0:
            raise RuntimeError(f"{tag}: client exited with {client.returncode}:\n{client_log.read_text(errors='replace')[-3000:]}")
        for line in out.splitlines():
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
        raise RuntimeError(f"{tag}: client printed no result:\n{out[-2000:]}")
    finally:
        Children.stop(worker)


def backend_env(name: str, children: Children, base: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("DYN_LOG", "warn")
    for k in ("DYN_DISCOVERY_BACKEND", "DYN_REQUEST_PLANE", "DYN_EVENT_PLANE", "DYN_FILE_KV", "ETCD_ENDPOINTS", "NATS_SERVER"):
        env.pop(k, None)
    if name == "embedded":
        kv = base / "file-kv"
        kv.mkdir()
        env.update(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(kv), DYN_REQUEST_PLANE="tcp", DYN_EVENT_PLANE="tcp")
    elif name == "etcd_nats":
        env.update(
            DYN_DISCOVERY_BACKEND="etcd",
            DYN_REQUEST_PLANE="nats",
            DYN_EVENT_PLANE="nats",
            ETCD_ENDPOINTS=start_etcd(children, base),
            NATS_SERVER=start_nats(children, base),
        )
    return env


def median_result(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-figure median of several runs (each figure separately)."""
    if len(runs) == 1:
        return runs[0]
    out: dict[str, Any] = {"runs": len(runs)}
    for key, first in runs[0].items():
        if isinstance(first, dict):
            out[key] = {k: statistics.median(r[key][k] for r in runs) for k in first}
    return out


def fmt(v: float | None, digits: int = 0) -> str:
    if v is None or math.isnan(v):
        return "–"
    return f"{v:,.{digits}f}"


def table(rows: list[tuple[str, str, dict[str, Any]]]) -> str:
    head = (
        "| backend | loop | RTT p50 µs | RTT p99 µs | RTT p50 annotated µs | req/s @64 (p50 µs) "
        "| req/s @256 (p50 µs) | items/s 1×20k | items/s 100×200 |"
    )
    lines = [head, "|" + "---|" * 9]
    for backend, loop, r in rows:
        ann = r.get("rtt_annotated", {}).get("p50_us")
        c64, c256 = r["conc_64"], r["conc_256"]
        errors = c64.get("errors", 0) + c256.get("errors", 0)
        lines.append(
            f"| {backend} | {loop} | {fmt(r['rtt']['p50_us'])} | {fmt(r['rtt']['p99_us'])} | {fmt(ann)} "
            f"| {fmt(c64['rps'])} ({fmt(c64['p50_us'])}) | {fmt(c256['rps'])} ({fmt(c256['p50_us'])}) "
            f"| {fmt(r['one_stream']['items_s'])} | {fmt(r['many_streams']['items_s'])} |"
            + (f" errors: {errors}" if errors else "")
        )
    lines.append(
        f"| target | | ≤ {fmt(TARGETS['rtt_p50_us'])} | | | ≥ {fmt(TARGETS['rps_64'])} | | ≥ {fmt(TARGETS['stream_items_s'])} | |"
    )
    return "\n".join(lines)


def orchestrate(args: argparse.Namespace) -> int:
    start = time.monotonic()
    deadline = start + args.timeout
    backends = [b for b in args.backends.split(",") if b]
    if args.baseline:
        backends.append("baseline")
    loops = [False, True] if args.uvloop else [False]
    children = Children()

    def on_signal(signum: int, _frame: Any) -> None:
        children.kill_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    rows: list[tuple[str, str, dict[str, Any]]] = []
    failures: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="dynamo-bench-"))
    try:
        for name in backends:
            base = tmp / name
            base.mkdir()
            try:
                env = backend_env(name, children, base)
            except Exception as e:
                failures.append(f"{name}: cannot start: {e}")
                continue
            for uv in loops:
                if time.monotonic() > deadline - 10:
                    failures.append(f"{name}{' uvloop' if uv else ''}: skipped, out of time")
                    continue
                loop_name = "uvloop" if uv else "asyncio"
                print(f"# running {name} ({loop_name}) ...", file=sys.stderr, flush=True)
                runs: list[dict[str, Any]] = []
                for _ in range(args.repeat):
                    if runs and time.monotonic() > deadline - 20:
                        break
                    try:
                        runs.append(run_case(children, name, uv, env, base, args, deadline))
                    except Exception as e:
                        failures.append(f"{name} ({loop_name}): {e}")
                        break
                if runs:
                    rows.append((name, loop_name, median_result(runs)))
            # Stop this backend's servers before the next one runs.
            for proc in list(children.procs):
                Children.stop(proc)
            children.procs.clear()
    finally:
        children.kill_all()
        if not args.keep_logs:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"# logs kept in {tmp}", file=sys.stderr)

    print()
    print(
        f"Machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, loopback; "
        f"load average at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}; "
        f"run took {time.monotonic() - start:.0f} s"
    )
    print()
    print(table(rows))
    for f in failures:
        print(f"\nFAILED: {f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": [{"backend": b, "loop": l, **r} for b, l, r in rows], "failures": failures}, indent=2))
    return 1 if failures else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--role", default="run", choices=["run", "worker", "client", "baseline-worker", "baseline-client"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--backends", default="embedded,etcd_nats", help="comma-separated: embedded, etcd_nats (default both)")
    p.add_argument("--baseline", action="store_true", help="also measure a bare asyncio echo over one TCP connection")
    p.add_argument("--uvloop", action="store_true", help="also measure with uvloop in both processes")
    p.add_argument("--repeat", type=int, default=1, help="run each case N times (fresh worker each time) and report medians")
    p.add_argument("--quick", action="store_true", help="a quarter of the requests and durations")
    p.add_argument("--timeout", type=float, default=170.0, help="bound on the whole run in seconds (default 170)")
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--keep-logs", action="store_true", help="keep worker/client/server logs")
    args = p.parse_args()
    if args.role == "worker":
        dynamo_worker_main(args)
    elif args.role == "client":
        dynamo_client_main(args)
    elif args.role == "baseline-worker":
        baseline_worker_main(args)
    elif args.role == "baseline-client":
        baseline_client_main(args)
    else:
        return orchestrate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Disaggregated serving with mocker workers in real processes, on both backends (the
embedded default: prefill jobs on the request plane; etcd + NATS: a JetStream queue):
a frontend, a decode worker and a prefill worker. Long prompts are prefilled on the
prefill worker and short ones stay local, counted from the workers' `/metrics`; a
prefill worker SIGKILLed while it holds jobs costs bounded errors or local prefills,
never a hang."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import openai
import pytest
from helpers import WorkerPool, WorkerProcess, free_port, wait_until, wait_until_blocking
from llm_helpers import HTTP_TIMEOUT, MOCKER, Frontend, http_request, start_frontend, write_json

pytestmark = pytest.mark.timeout(150)

#: Decode worker setting: prompts whose uncached part is longer go to the prefill worker.
MAX_LOCAL = 64



def prompt(first_word: int, words: int) -> str:
    """A prompt of `words` distinct vocabulary words (one token each), starting at
    `w{first_word}`: prompts that start differently share no cached prefix."""
    return " ".join(f"w{3 + (first_word + i) % 1000}" for i in range(words))


def metric(port: int, name: str, label: str) -> float:
    """`name{label}` from the system server on `port` (0 when not exported yet)."""
    response = http_request(port, "GET", "/metrics")
    assert response.status == 200, response
    pattern = re.compile(rf"^{re.escape(name)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$", re.M)
    found = pattern.findall(response.body.decode())
    return sum(float(v) for v in found)


async def wait_metric(port: int, name: str, label: str, at_least: float, timeout: float = 20.0) -> float:
    value = 0.0

    async def reached() -> bool:
        nonlocal value
        value = await asyncio.to_thread(metric, port, name, label)
        return value >= at_least

    await wait_until(reached, timeout, lambda: f"{name}{{{label}}} to reach {at_least} (it is {value})", interval=0.2)
    return value


class Graph:
    """A prefill worker, a decode worker and a frontend, each with its system port."""

    def __init__(self, prefill: WorkerProcess, prefill_port: int, decode: WorkerProcess, decode_port: int,
                 frontend: Frontend):
        self.prefill, self.prefill_port = prefill, prefill_port
        self.decode, self.decode_port = decode, decode_port
        self.frontend = frontend

    def prefills(self, source: str) -> float:
        return metric(self.decode_port, "dynamo_disagg_prefills_total", f'source="{source}"')

    def jobs(self, outcome: str) -> float:
        return metric(self.prefill_port, "dynamo_disagg_prefill_jobs_total", f'outcome="{outcome}"')


def mocker(pool: WorkerPool, endpoint: str, model_dir: Path, system_port: int, *args: str, name: str) -> WorkerProcess:
    env = {
        **pool.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(system_port)
    }
    argv = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint, *args]
    return pool.command(argv, name=name, env=env)


async def start_graph(
    pool: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path, *, prefill_settings: dict[str, object],
    decode_args: tuple[str, ...] = (),
) -> Graph:
    prefill_port, decode_port = free_port(), free_port()
    prefill = mocker(
        pool, f"{namespace}.prefill.generate", model_dir, prefill_port, "--role", "prefill",
        "--extra-engine-args", str(write_json(tmp_path / "prefill.json", prefill_settings)), name="prefill",
    )
    await prefill.wait_for_line("dynamo-run: serving prefill jobs", 30)
    decode = mocker(
        pool, f"{namespace}.mocker.generate", model_dir, decode_port, "--role", "decode",
        "--max-local-prefill-length", str(MAX_LOCAL), "--extra-engine-args",
        str(write_json(tmp_path / "decode.json", {"speedup_ratio": 20.0})), *decode_args, name="decode",
    )
    status = await decode.wait_for_line("dynamo-run: serving model", 30)
    # The prefill queue is durable on JetStream with NATS, on the request plane otherwise.
    transport = "NATS JetStream" if pool.env.get("DYN_EVENT_PLANE") == "nats" else "request plane"
    assert f"role decode, prefill queue on {transport} to dyn://{namespace}.prefill.generate" in status, status
    frontend = await start_frontend(pool, "dyn")
    await frontend.wait_models([model_dir.name])
    return Graph(prefill, prefill_port, decode, decode_port, frontend)


def client(frontend: Frontend) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)


async def long_completion(c: openai.AsyncOpenAI, model: str, i: int) -> str:
    """Complete the i-th distinct prompt that is too long to prefill locally: its finish
    reason, or the error."""
    try:
        response = await c.completions.create(model=model, prompt=prompt(i * 199, 3 * MAX_LOCAL), max_tokens=3)
        return response.choices[0].finish_reason or "none"
    except openai.APIError as e:
        return f"error: {e}"


async def test_long_prompts_prefill_remotely_short_ones_locally(
    workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    graph = await start_graph(workers, namespace, model_dir, tmp_path, prefill_settings={"speedup_ratio": 20.0})
    c = client(graph.frontend)
    try:
        for i in range(3):
            short = await c.completions.create(model=model_dir.name, prompt=prompt(i * 10, 8), max_tokens=4)
            assert short.usage is not None and short.usage.completion_tokens == 4
        assert (graph.prefills("local"), graph.prefills("remote")) == (3, 0)

        for i in range(3):
            stream = await c.completions.create(
                model=model_dir.name, prompt=prompt(100 + i * 200, 3 * MAX_LOCAL), max_tokens=6, stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
            assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == [
                "length"
            ]
        assert graph.prefills("remote") == 3
        assert graph.prefills("local") == 3 and graph.prefills("fallback") == 0
        assert graph.jobs("done") == 3

        # The same long prompt again: its KV came over and is cached, so the uncached
        # part is short and the prefill stays local.
        again = await c.completions.create(model=model_dir.name, prompt=prompt(100, 3 * MAX_LOCAL), max_tokens=2)
        assert again.choices[0].finish_reason == "length"
        assert (graph.prefills("remote"), graph.prefills("local")) == (3, 4)
    finally:
        await c.close()


async def test_prefill_worker_killed_mid_load_is_bounded(
    workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    # A slow prefill worker (about 1.5 s per prompt) that will hold every job when killed.
    graph = await start_graph(
        workers, namespace, model_dir, tmp_path,
        prefill_settings={"prefill_ms_per_token": 8.0, "max_num_batched_tokens": 256},
        decode_args=("--max-prefill-queue-size", "100", "--remote-prefill-timeout", "8"),
    )
    c = client(graph.frontend)
    try:
        started = time.monotonic()
        requests = [asyncio.create_task(long_completion(c, model_dir.name, i)) for i in range(6)]
        await wait_metric(graph.prefill_port, "dynamo_disagg_prefill_jobs_total", 'outcome="done"', 1)
        graph.prefill.kill()  # SIGKILL while it holds the other jobs
        outcomes = await asyncio.wait_for(asyncio.gather(*requests), timeout=40)
        elapsed = time.monotonic() - started
    finally:
        await c.close()
    # Every request ended (bounded by the remote prefill timeout, 8 s, plus local work);
    # those whose prefill was lost were prefilled locally.
    assert elapsed < 40
    finished = [o for o in outcomes if o == "length"]
    assert len(finished) + len([o for o in outcomes if o.startswith("error")]) == 6, outcomes
    assert len(finished) == 6, outcomes
    assert graph.prefills("remote") >= 1
    assert graph.prefills("fallback") >= 1, (graph.prefills("remote"), graph.prefills("local"))
    assert graph.prefills("remote") + graph.prefills("fallback") + graph.prefills("local") == 6

    # The decode worker keeps serving with no prefill worker.
    c = client(graph.frontend)
    try:
        after = await asyncio.wait_for(
            c.completions.create(model=model_dir.name, prompt=prompt(500, 3 * MAX_LOCAL), max_tokens=2), timeout=30
        )
    finally:
        await c.close()
    assert after.choices[0].finish_reason == "length"


def test_mocker_disagg_flags_reach_dynamo_run() -> None:
    from dynamo.mocker.__main__ import dynamo_run_argv, parse_args

    args = parse_args([
        "--model-path", "m", "--role", "decode", "--max-local-prefill-length", "64", "--max-prefill-queue-size", "0",
        "--remote-prefill-timeout", "2.5", "--kv-transfer-bandwidth", "50", "--prefill-endpoint", "ns.pre.generate",
    ])
    argv = dynamo_run_argv(args, None)
    for flag, value in (
        ("--role", "decode"), ("--max-local-prefill-length", "64"), ("--max-prefill-queue-size", "0"),
        ("--remote-prefill-timeout", "2.5"), ("--kv-transfer-bandwidth", "50.0"),
        ("--prefill-endpoint", "ns.pre.generate"),
    ):
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--role" not in dynamo_run_argv(parse_args(["--model-path", "m"]), None)
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "m", "--role", "both"])


def test_a_prefill_role_without_a_worker_endpoint_is_a_usage_error(workers_local: WorkerPool) -> None:
    import subprocess

    from llm_helpers import DYNAMO_RUN

    done = subprocess.run(
        [*DYNAMO_RUN, "in=http", "out=mocker", "--role", "prefill"], env=workers_local.env, capture_output=True,
        text=True, timeout=30,
    )
    assert done.returncode == 2, done
    assert "in=dyn://" in done.stderr, done.stderr


def test_decode_worker_on_nats_without_jetstream_says_so(tmp_path: Path, workers_local: WorkerPool) -> None:
    """The durable prefill queue needs JetStream: a decode worker on a NATS event plane
    whose server runs without it exits with an error that says how to fix it."""
    import shutil
    import socket
    import subprocess

    from helpers import spawn

    binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
    port = free_port()
    nats = spawn([binary, "-a", "127.0.0.1", "-p", str(port)], env=dict(workers_local.env),
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:

        def accepting() -> bool:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True

        wait_until_blocking(accepting, 10, "nats-server to accept connections", interval=0.1, ignore=(OSError,))
        (tmp_path / "kv").mkdir()
        env = {**workers_local.env, "DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(tmp_path / "kv"),
               "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "nats", "NATS_SERVER": f"nats://127.0.0.1:{port}",
               "DYN_TCP_HOST": "127.0.0.1"}
        done = subprocess.run([*MOCKER, "--endpoint", "dyn://nojs.mocker.generate", "--role", "decode"], env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        nats.kill()
        nats.wait(timeout=10)
    assert done.returncode != 0, done
    assert "JetStream" in done.stderr and "nats-server -js" in done.stderr, done.stderr[-2000:]

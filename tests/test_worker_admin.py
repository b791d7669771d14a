"""The worker admin API in real processes, on both backends (docs/reliability.md, "Drain
and resume"): two mocker workers behind a frontend under load; `POST /drain` to one
(through `dynamo worker drain`) takes it out of routing while its in-flight streams
finish: 0 failed requests, it serves nothing new after the call returned, its `/ready`
says `draining` and `GET /state` goes draining → drained; `POST /resume` brings it back
into routing; both calls are idempotent. With a deadline (`--deadline-s`), the streams
still running at the deadline are ended and the frontend's migration (on by default)
continues them on the other worker: 0 failed requests, each output byte-identical to an
uninterrupted run with the same seed. SIGTERM past `DYN_SHUTDOWN_TIMEOUT` ends the
streams still running the same way (the scale-down path)."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from dynamo.sdk.cli import worker as admin
from helpers import WorkerPool, free_port, wait_for_instances, wait_until
from llm_helpers import MOCKER, Frontend, chat_body, http_request, post_json, sse_data, start_frontend, write_json

pytestmark = pytest.mark.timeout(150)

#: A stream of 30 tokens at this speed lasts a second or more: in flight at the drain.
SLOW_MOCKER = {"speedup_ratio": 0.1}
MAX_TOKENS = 30
#: Seconds at this speed: still running at a deadline of half a second.
LONG_TOKENS = 120


def start_worker(workers: WorkerPool, model_dir: Path, endpoint: str, settings: Path, name: str,
                 env: dict[str, str] | None = None) -> int:
    """A mocker worker with its system server (and ``env`` on top of the pool's); returns
    the system port."""
    port = free_port()
    argv = [*MOCKER, "--model-path", str(model_dir), "--model-name", "m", "--endpoint", endpoint,
            "--extra-engine-args", str(settings)]
    workers.command(argv, name=name, env={
        **workers.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1", "DYN_SYSTEM_PORT": str(port),
        **(env or {}),
    })
    return port


def served(port: int) -> float:
    """Requests the worker on system port `port` has received (its endpoint counter)."""
    text = http_request(port, "GET", "/metrics", timeout=2).body.decode()
    found = re.search(r'^dynamo_endpoint_requests_total\{[^}]*endpoint="generate"[^}]*\} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def cli(verb: str, port: int, *extra: str) -> dict[str, Any]:
    """`dynamo worker VERB 127.0.0.1:PORT`, as an operator runs it; its JSON answer."""
    done = subprocess.run([sys.executable, "-m", "dynamo.sdk.cli.main", "worker", verb, f"127.0.0.1:{port}", *extra],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def send(frontend: Frontend, count: int) -> list[Any]:
    """`count` streaming requests at once through `frontend`, as running tasks."""
    body = chat_body("m", "w5 w6 w7", max_tokens=MAX_TOKENS, stream=True)
    return [asyncio.ensure_future(asyncio.to_thread(post_json, frontend.port, "/v1/chat/completions", body, 60))
            for _ in range(count)]


async def two_slow_workers_and_a_frontend(workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path,
                                          runtime: Any, a_env: dict[str, str] | None = None,
                                          ) -> tuple[int, Any, Frontend]:
    """Two slow mocker workers, both registered and ready, and a frontend listing their
    model: the first worker's system port, a client of their endpoint, the frontend
    (``a_env``: environment for the first worker on top of the pool's; it is
    ``workers.started[0]``)."""
    settings = write_json(tmp_path / "slow.json", SLOW_MOCKER)
    endpoint = f"{namespace}.mocker.generate"
    a = start_worker(workers, model_dir, endpoint, settings, "worker-a", a_env)
    b = start_worker(workers, model_dir, endpoint, settings, "worker-b")
    client = await runtime.namespace(namespace).component("mocker").endpoint("generate").client()
    await wait_for_instances(client, 2)
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models(["m"])
    for port in (a, b):
        await wait_until(lambda p=port: http_request(p, "GET", "/ready", timeout=2).status == 200, 30, "ready",
                         ignore=(OSError,))
    return a, client, frontend


async def test_drain_under_load_then_resume(workers: WorkerPool, namespace: str, model_dir: Path,
                                            tmp_path: Path, runtime: Any) -> None:
    a, client, frontend = await two_slow_workers_and_a_frontend(workers, namespace, model_dir, tmp_path, runtime)
    assert admin.call(f"127.0.0.1:{a}", "state") == {"state": "serving", "inflight": 0, "deadline_in_s": None, "cut": 0}

    load = send(frontend, 6)  # round-robin: three on each worker
    await wait_until(lambda: admin.call(f"127.0.0.1:{a}", "state")["inflight"] >= 1, 20, "a stream in flight on A")
    drained = await asyncio.to_thread(cli, "drain", a)
    drain_returned = time.monotonic()
    assert drained["state"] in ("draining", "drained"), drained
    served_at_drain = served(a)
    assert http_request(a, "GET", "/ready", timeout=2).status == 503
    assert json.loads(http_request(a, "GET", "/ready", timeout=2).body)["status"] == "draining"
    # Leaving routing is measured here (a log line for the report), not asserted as a time.
    await wait_until(lambda: len(client.instance_ids()) == 1, 10, "A out of discovery")
    print(f"worker left discovery {1000 * (time.monotonic() - drain_returned):.0f} ms after /drain returned")

    more = send(frontend, 6)  # all to B now: A serves nothing new
    answers = await asyncio.gather(*load, *more)
    assert [r.status for r in answers] == [200] * 12, [r.body[:200] for r in answers if r.status != 200]
    assert all(b"[DONE]" in r.body for r in answers)
    assert served(a) == served_at_drain, "a request reached the drained worker"
    await wait_until(lambda: admin.call(f"127.0.0.1:{a}", "state")["state"] == "drained", 30, "A drained")
    assert cli("drain", a) == {"state": "drained", "inflight": 0, "deadline_in_s": None, "cut": 0}, \
        "a second drain changes nothing"

    resumed = cli("resume", a)
    assert resumed["state"] == "serving", resumed
    assert admin.call(f"127.0.0.1:{a}", "resume")["state"] == "serving", "a second resume changes nothing"
    await wait_until(lambda: len(client.instance_ids()) == 2, 10, "A back in discovery")
    assert http_request(a, "GET", "/ready", timeout=2).status == 200
    body = chat_body("m", "w8", max_tokens=2)

    def a_serves_again() -> bool:
        assert frontend.post("/v1/chat/completions", body).status == 200
        return served(a) > served_at_drain

    await wait_until(a_serves_again, 20, "A to serve a request again")


def completion(max_tokens: int) -> dict[str, Any]:
    """A seeded streaming completion of `max_tokens` tokens (`ignore_eos`: the mocker may
    draw the end-of-sequence token); its prompt is words of the test model's vocabulary
    (w3, w4, …), from which the mocker draws its tokens: the same seed, the same text."""
    prompt = " ".join(f"w{i}" for i in range(3, 40))
    return {"model": "m", "prompt": prompt, "stream": True, "max_tokens": max_tokens, "seed": 1234, "ignore_eos": True}


def completion_text(body: bytes) -> str:
    payloads = sse_data(body)
    assert payloads and payloads[-1] == "[DONE]", payloads[-3:]
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not any("error" in c for c in chunks), [c for c in chunks if "error" in c]
    return "".join(c["choices"][0].get("text") or "" for c in chunks if c.get("choices"))


async def test_drain_deadline_migrates_the_streams_still_running(workers: WorkerPool, namespace: str, model_dir: Path,
                                                                 tmp_path: Path, runtime: Any) -> None:
    # The frontend's defaults: migration on, limit 3.
    a, _, frontend = await two_slow_workers_and_a_frontend(workers, namespace, model_dir, tmp_path, runtime)
    body = completion(LONG_TOKENS)
    reference = completion_text((await asyncio.to_thread(post_json, frontend.port, "/v1/completions", body, 90)).body)
    assert reference, "the reference run generated text"

    # Round-robin: two on each worker. Four, so that the default executor (six threads on
    # two cores) keeps a thread for the polls below.
    load = [asyncio.ensure_future(asyncio.to_thread(post_json, frontend.port, "/v1/completions", body, 90))
            for _ in range(4)]
    await wait_until(lambda: admin.call(f"127.0.0.1:{a}", "state")["inflight"] >= 1, 20, "a stream in flight on A")
    drained = await asyncio.to_thread(admin.call, f"127.0.0.1:{a}", "drain", deadline_s=0.5)
    assert drained["state"] == "draining" and drained["inflight"] >= 1, drained
    assert 0 < drained["deadline_in_s"] <= 0.5, drained
    served_at_drain = served(a)
    answers = await asyncio.gather(*load)
    assert [r.status for r in answers] == [200] * 4, [r.body[:200] for r in answers if r.status != 200]
    for answer in answers:
        assert completion_text(answer.body) == reference, "a migrated stream differs from the uninterrupted run"
    status = admin.call(f"127.0.0.1:{a}", "state")
    assert status["state"] == "drained" and status["inflight"] == 0 and status["deadline_in_s"] == 0, status
    assert status["cut"] >= 1, f"no stream was still running at the deadline: {status}"
    assert served(a) == served_at_drain, "a request reached the drained worker"
    metrics = frontend.get("/metrics").body.decode()
    migrated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("dynamo_frontend_migrations_total"))
    assert migrated >= status["cut"], "each stream ended at the deadline was continued on B"
    # The operator's command passes a deadline too; a resume drops it.
    again = cli("drain", a, "--deadline-s", "30")
    assert again["state"] == "drained" and 29 < again["deadline_in_s"] <= 30, again
    resumed = cli("resume", a)
    assert resumed["state"] == "serving" and resumed["deadline_in_s"] is None, resumed


async def test_sigterm_past_the_shutdown_bound_migrates_the_streams_still_running(
        workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path, runtime: Any) -> None:
    """The scale-down path (the planner's connectors, `dynamo serve`, Kubernetes): SIGTERM,
    in-flight streams finish within `DYN_SHUTDOWN_TIMEOUT`, and those still running at the
    bound are ended as unavailable, as a drain deadline ends them. The frontend's
    migration continues them on the other worker, so its client sees one whole stream; a
    frontend without migration passes the error on, naming the bound, and never ends such
    a stream as if it were whole."""
    a, _, frontend = await two_slow_workers_and_a_frontend(workers, namespace, model_dir, tmp_path, runtime,
                                                           a_env={"DYN_SHUTDOWN_TIMEOUT": "0.5"})
    no_migration = await start_frontend(workers, "dyn", "--migration-limit", "0")
    await no_migration.wait_models(["m"])
    victim = workers.started[0]
    body = completion(LONG_TOKENS)
    reference = completion_text((await asyncio.to_thread(post_json, frontend.port, "/v1/completions", body, 90)).body)

    def send_to(port: int, count: int) -> list[Any]:
        return [asyncio.ensure_future(asyncio.to_thread(post_json, port, "/v1/completions", body, 90))
                for _ in range(count)]

    # Round-robin from each frontend: one of each pair on A.
    load, unmigrated = send_to(frontend.port, 2), send_to(no_migration.port, 2)
    await wait_until(lambda: admin.call(f"127.0.0.1:{a}", "state")["inflight"] >= 2, 20, "two streams in flight on A")
    victim.send_signal(signal.SIGTERM)
    assert await victim.wait_exit(15) == 0, victim.describe()
    answers = await asyncio.gather(*load)
    assert [r.status for r in answers] == [200] * 2, [r.body[:200] for r in answers if r.status != 200]
    for answer in answers:
        assert completion_text(answer.body) == reference, "a migrated stream differs from the uninterrupted run"
    assert "drain bound reached" in victim.stderr_path.read_text(errors="replace"), victim.describe()
    metrics = frontend.get("/metrics").body.decode()
    migrated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("dynamo_frontend_migrations_total"))
    assert migrated >= 1, "the stream A still ran at its bound was continued on B"
    # Without migration: B's stream whole, A's ended by the error that names the bound.
    ends = [sse_data(r.body)[-1] for r in await asyncio.gather(*unmigrated)]
    assert ends.count("[DONE]") == 1, ends
    [cut] = [json.loads(end) for end in ends if end != "[DONE]"]
    assert "drain bound" in cut["error"]["message"], cut

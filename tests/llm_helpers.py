"""Helpers of the LLM serving tests: the `dynamo-run` command, a frontend process and
raw HTTP against it, SSE parsing, a small HuggingFace-style model folder, mocker workers.

Everything is bounded: waits fail the test naming what they waited for and the process's
stderr.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import READY_TIMEOUT, WorkerPool, WorkerProcess, free_port, wait_until, wait_until_blocking

#: `dynamo-run` as this Python runs it (the console script's entry point, whichever
#: Python and PYTHONPATH the tests run with).
DYNAMO_RUN = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()"]
#: `python -m dynamo.mocker`.
MOCKER = [sys.executable, "-m", "dynamo.mocker"]
#: Bound on one HTTP exchange.
HTTP_TIMEOUT = 20.0
#: Vocabulary size of the test model folder (the mocker generates ids in 100..1000).
TEST_VOCAB_SIZE = 1024


@dataclass
class Response:
    """A whole HTTP response."""

    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def http_request(
    port: int, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None,
    timeout: float = HTTP_TIMEOUT,
) -> Response:
    """One request to 127.0.0.1:`port` on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    finally:
        conn.close()


def post_json(port: int, path: str, obj: Any, timeout: float = HTTP_TIMEOUT) -> Response:
    """POST `obj` as JSON."""
    return http_request(port, "POST", path, json.dumps(obj).encode(), {"Content-Type": "application/json"}, timeout)


def sse_data(body: bytes) -> list[str]:
    """The `data:` payloads of an SSE body, in order; fails on a line that is neither
    `data: ...`, an SSE comment, nor blank."""
    payloads = []
    for line in body.decode().split("\n"):
        if line.startswith("data: "):
            payloads.append(line[len("data: "):])
        elif line and not line.startswith(":"):
            pytest.fail(f"unexpected SSE line {line!r} in:\n{body.decode()[:2000]}")
    return payloads


def chat_body(model: str, content: str, **extra: Any) -> dict[str, Any]:
    """A chat completions request with one user message."""
    return {"model": model, "messages": [{"role": "user", "content": content}], **extra}


def streamed_content(body: bytes) -> tuple[str, list[dict[str, Any]]]:
    """The concatenated delta content of a streamed chat response, and every chunk."""
    payloads = sse_data(body)
    assert payloads and payloads[-1] == "[DONE]", f"stream did not end with [DONE]: {payloads[-3:]}"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text = "".join((c["choices"][0]["delta"].get("content") or "") for c in chunks if c.get("choices"))
    return text, chunks


class Frontend:
    """A `dynamo-run in=http` process on a free port."""

    def __init__(self, process: WorkerProcess, port: int):
        self.process = process
        self.port = port

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def get(self, path: str) -> Response:
        return http_request(self.port, "GET", path)

    def post(self, path: str, obj: Any, timeout: float = HTTP_TIMEOUT) -> Response:
        return post_json(self.port, path, obj, timeout)

    def held_busy(self, model: str) -> float:
        """Its `dynamo_frontend_requests_waiting_for_capacity` gauge for `model`: requests
        held now while every worker is busy (`--busy-wait-s`)."""
        pattern = rf'^dynamo_frontend_requests_waiting_for_capacity{{model="{re.escape(model)}"}} (\S+)$'
        found = re.search(pattern, self.get("/metrics").body.decode(), re.MULTILINE)
        return float(found.group(1)) if found else 0.0

    def models(self) -> list[str]:
        """The ids `/v1/models` lists now."""
        return sorted(m["id"] for m in self.get("/v1/models").json()["data"])

    def wait_live_blocking(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the process answers `/live` (blocking the calling thread)."""

        def live() -> bool:
            if self.process.proc.poll() is not None:
                pytest.fail(f"the frontend exited at start\n{self.process.describe()}")
            http_request(self.port, "GET", "/live", timeout=1.0)
            return True

        wait_until_blocking(live, timeout, lambda: f"the frontend to answer /live\n{self.process.describe()}",
                            ignore=(OSError,))

    async def wait_live(self, timeout: float = READY_TIMEOUT) -> None:
        """Wait until the process answers `/live`."""
        await asyncio.to_thread(self.wait_live_blocking, timeout)

    async def wait_models(self, expected: list[str], timeout: float = READY_TIMEOUT) -> None:
        """Wait until `/v1/models` lists exactly `expected` (any order)."""
        seen: list[str] = []

        async def listed() -> bool:
            nonlocal seen
            seen = await asyncio.to_thread(self.models)
            return seen == sorted(expected)

        await wait_until(
            listed, timeout,
            lambda: f"/v1/models to list {sorted(expected)} (it listed {seen})\n{self.process.describe()}",
            interval=0.1, ignore=(OSError,),
        )

    async def wait_status(self, path: str, status: int, timeout: float = READY_TIMEOUT) -> Response:
        """Wait until GET `path` answers `status`; returns that response."""
        last: Response | None = None

        async def answered() -> Response | None:
            nonlocal last
            last = await asyncio.to_thread(self.get, path)
            return last if last.status == status else None

        def what() -> str:
            got = f"{last.status} {last.body[:300]!r}" if last else "no answer"
            return f"GET {path} to answer {status} (last: {got})"

        return await wait_until(answered, timeout, what, interval=0.1, ignore=(OSError,))


def launch_frontend(pool: WorkerPool, out: str, *args: str, env: dict[str, str] | None = None) -> Frontend:
    """Start `dynamo-run in=http out=<out>` on a free port (without waiting)."""
    port = free_port()
    argv = [*DYNAMO_RUN, "in=http", f"out={out}", "--http-port", str(port), *args]
    name = "frontend-" + out.replace("://", "-").replace("/", "_")  # a file name for its logs
    return Frontend(pool.command(argv, name=name, env=env), port)


async def start_frontend(pool: WorkerPool, out: str, *args: str, env: dict[str, str] | None = None) -> Frontend:
    """Start `dynamo-run in=http out=<out>` on a free port and wait until it is live."""
    frontend = launch_frontend(pool, out, *args, env=env)
    await frontend.wait_live()
    return frontend


def local_env(**extra: str) -> dict[str, str]:
    """This process's environment without the runtime's settings (for processes that
    need no discovery: `in=http` with a local engine, `in=batch`)."""
    runtime_keys = ("ETCD_ENDPOINTS", "NATS_SERVER")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_") and k not in runtime_keys}
    env["DYN_LOG"] = os.environ.get("DYN_LOG", "warn")
    return {**env, **extra}


def start_mocker(pool: WorkerPool, endpoint: str, model_dir: Path, *args: str, name: str = "mocker") -> WorkerProcess:
    """Start a mocker worker (`python -m dynamo.mocker`) serving `endpoint`."""
    argv = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint, *args]
    return pool.command(argv, name=name)


def write_model_dir(root: Path, name: str = "tiny-words", context_length: int = 4096) -> Path:
    """A HuggingFace-style model folder the mocker can serve: a WordLevel tokenizer with
    `TEST_VOCAB_SIZE` words (`<unk>`, `<s>`, `</s>`, then `w3`, `w4`, ...), a chat template
    and a config. Words outside the vocabulary tokenize to `<unk>`."""
    directory = root / name
    directory.mkdir(parents=True)

    def special(token_id: int, content: str) -> dict[str, Any]:
        return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{i}": i for i in range(3, TEST_VOCAB_SIZE)})
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": None, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "unk_token": "<unk>", "vocab": vocab},
    }
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }} {% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", "chat_template": template}
    config = {"max_position_embeddings": context_length, "eos_token_id": 2}
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def write_json(path: Path, obj: Any) -> Path:
    """Write `obj` as JSON to `path`; returns `path`."""
    path.write_text(json.dumps(obj))
    return path


async def wait_for_metrics_from(subscription: Any, workers: set[int], timeout: float = READY_TIMEOUT) -> None:
    """Wait until `subscription` (a component's `load_metrics`; mockers report at least
    every second) has carried a report from each of `workers`."""
    heard: set[int] = set()

    async def listen() -> None:
        async for event in subscription:
            heard.add((event if isinstance(event, dict) else json.loads(event))["worker_id"])
            if workers <= heard:
                return
        raise AssertionError("the subscription ended")

    try:
        await asyncio.wait_for(listen(), timeout)
    except asyncio.TimeoutError:
        pytest.fail(f"timed out after {timeout:.1f}s waiting for load metrics from {sorted(workers - heard)}")


async def first_load_report(subscription: Any, ok: Any, timeout: float, what: str) -> dict[str, Any]:
    """The first load report on `subscription` (a component's `load_metrics`) for which
    `ok(report)` holds; fails the test naming `what` after `timeout` seconds."""
    from helpers import bounded

    async def first() -> dict[str, Any]:
        async for event in subscription:
            report = event if isinstance(event, dict) else json.loads(event)
            if ok(report):
                return report
        raise AssertionError("the subscription ended")

    return await bounded(first(), timeout, what)


class HandlerContext:
    """The parts of a `RequestContext` an engine handler uses, for calling a handler
    directly: the request id, and `is_stopped()` once `stop_after` items were counted
    (the caller counts them in `items`)."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.items = 0
        self.stop_after = stop_after

    def id(self) -> str:
        return "req-1"

    def is_stopped(self) -> bool:
        return self.stop_after is not None and self.items >= self.stop_after


def planner_health(port: int) -> dict[str, Any]:
    """The body of a planner's ``/health`` (the same body comes with its 503 while a signal
    is not ok)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        return json.loads(e.read())


def planner_metrics(port: int) -> tuple[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]]:
    """A planner's ``/metrics``: its content type and each sample, keyed by its name and
    its labels (sorted)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
        kind, text = response.headers["Content-Type"], response.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return kind, samples


class Planner:
    """A `python -m dynamo.planner --config CONFIG` process on a free health port."""

    def __init__(self, pool: WorkerPool, config: Path):
        self.port = free_port()
        argv = [sys.executable, "-m", "dynamo.planner", "--config", str(config), "--port", str(self.port)]
        self.process = pool.command(argv, name="planner")

    def health(self) -> dict[str, Any]:
        return planner_health(self.port)

    def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return planner_metrics(self.port)[1]

    def fleet(self, role: str = "agg") -> dict[str, int]:
        """The role's `{"ready": n, "pending": m}` as the planner sees it."""
        return self.health().get("fleet", {}).get(role, {})

    def describe(self) -> str:
        """Its health and its output, for a failure message."""
        return f"planner health: {json.dumps(self.health())[:3000]}\n{self.process.describe()}"

    async def stop(self) -> None:
        """SIGTERM: it drains its workers and exits 0."""
        self.process.send_signal(signal.SIGTERM)
        assert await self.process.wait_exit(40) == 0, self.process.describe()

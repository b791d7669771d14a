"""The OpenAI frontend as a public endpoint, as processes (`dynamo-run in=http`):
big prompts refused or tokenized off the async threads (with the server's RSS read
from /proc), connection timeouts, the in-flight cap, the API key, request ids,
default `max_tokens`, `n`, `logprobs` through the official `openai` client, and a
bounded fuzz run of mutated JSON bodies."""

from __future__ import annotations

import copy
import http.client
import json
import random
import re
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import WorkerPool, wait_until_blocking
from llm_helpers import (
    HTTP_TIMEOUT,
    Frontend,
    chat_body,
    http_request,
    launch_frontend,
    local_env,
    post_json,
    write_model_dir,
)

ECHO = "echo"
TINY = "tiny"
KEY = "test-key"
#: The tiny model's context: the byte bound on its prompts is 16 bytes a token (8 MiB).
TINY_CONTEXT = 524288
#: Generous bound on the frontend's resident memory after refusing big prompts.
RSS_BOUND_BYTES = 1 << 30


def _frontend(pool: WorkerPool, out: str, *args: str, **env: str) -> Frontend:
    frontend = launch_frontend(pool, out, *args, env=local_env(**env))
    frontend.wait_live_blocking()
    return frontend


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    pool = WorkerPool(local_env(), tmp_path_factory.mktemp("http-public-logs"))
    try:
        yield pool
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def echo(pool: WorkerPool) -> Frontend:
    """echo_full without delay, default limits."""
    return _frontend(pool, "echo_full", "--model-name", ECHO, DYN_TOKEN_ECHO_DELAY_MS="0")


@pytest.fixture(scope="module")
def tiny(pool: WorkerPool, tmp_path_factory: pytest.TempPathFactory) -> Frontend:
    """The mocker with a word-level tokenizer and a 512k context, default max_tokens 7."""
    model_dir = write_model_dir(tmp_path_factory.mktemp("tiny-model"), context_length=TINY_CONTEXT)
    return _frontend(
        pool, "mocker", "--model-path", str(model_dir), "--model-name", TINY, "--default-max-tokens", "7",
    )


@pytest.fixture(scope="module")
def guarded(pool: WorkerPool) -> Frontend:
    """echo_full, 50 ms a character, one request in flight, an API key, 1 s header timeout."""
    return _frontend(
        pool, "echo_full", "--model-name", ECHO, "--http-max-inflight", "1", "--api-key", KEY,
        "--http-header-timeout", "1", DYN_TOKEN_ECHO_DELAY_MS="50",
    )


def client(frontend: Frontend, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key=key, max_retries=0, timeout=HTTP_TIMEOUT)


def inflight(port: int, model: str) -> int:
    """The frontend's `dynamo_frontend_inflight_requests` of `model` (requests whose body
    was read and whose engine call started, until their response ends)."""
    text = http_request(port, "GET", "/metrics", timeout=HTTP_TIMEOUT).body.decode()
    match = re.search(rf'^dynamo_frontend_inflight_requests{{model="{re.escape(model)}"}} (\d+)$', text, re.M)
    return int(match.group(1)) if match else 0


def rss_bytes(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of `pid`, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


# --------------------------------------------------------------------------- bounded work


def test_an_oversized_prompt_is_a_400_without_tokenizing(tiny: Frontend) -> None:
    big = "w5 " * (10 * 1024 * 1024)  # 30 MiB: far beyond what 512k tokens could be
    for _ in range(3):
        resp = post_json(tiny.port, "/v1/chat/completions", chat_body(TINY, big), timeout=60)
        assert resp.status == 400, resp.body[:300]
        error = resp.json()["error"]
        assert "bytes of prompt" in error["message"] and error["type"] == "invalid_request_error"
    rss, peak = rss_bytes(tiny.process.proc.pid)
    print(f"after three 30 MiB prompts: RSS {rss >> 20} MiB, peak {peak >> 20} MiB")
    assert rss < RSS_BOUND_BYTES and peak < RSS_BOUND_BYTES, f"RSS {rss >> 20} MiB, peak {peak >> 20} MiB"
    assert tiny.post("/v1/chat/completions", chat_body(TINY, "w5 w6")).status == 200


def test_small_requests_are_answered_while_big_prompts_tokenize(tiny: Frontend) -> None:
    # Within the context, so tokenized in full (then refused by the mocker: more
    # tokens than its KV cache holds); six of them queue for the CPUs' permits.
    big = chat_body(TINY, "w7 " * 500_000)
    finished: dict[str, float] = {}
    statuses: dict[str, int] = {}

    def send(name: str, body: dict[str, Any], path: str = "/v1/chat/completions") -> None:
        resp = post_json(tiny.port, path, body, timeout=120)
        statuses[name] = resp.status
        finished[name] = time.monotonic()

    bigs = [threading.Thread(target=send, args=(f"big{i}", big)) for i in range(6)]
    for t in bigs:
        t.start()
    # All six bodies are uploaded and being tokenized (or queued for it): in flight.
    wait_until_blocking(lambda: inflight(tiny.port, TINY) == 6 or len(finished) > 0, HTTP_TIMEOUT,
                        lambda: f"six big requests in flight (finished: {finished})")
    assert not finished, f"a big prompt was answered before the small request was sent: {statuses}"
    health = http_request(tiny.port, "GET", "/health", timeout=HTTP_TIMEOUT)
    health_done = time.monotonic()
    send("small", chat_body(TINY, "w5 w6", max_tokens=2))
    for t in bigs:
        t.join(timeout=120)
    assert health.status == 200
    assert statuses["small"] == 200
    assert all(statuses[f"big{i}"] == 400 for i in range(6)), statuses
    rss, peak = rss_bytes(tiny.process.proc.pid)
    print(f"after six 1.5 MB prompts tokenized: RSS {rss >> 20} MiB, peak {peak >> 20} MiB, times {finished}")
    assert rss < RSS_BOUND_BYTES and peak < RSS_BOUND_BYTES, f"RSS {rss >> 20} MiB, peak {peak >> 20} MiB"
    first_big = min(finished[f"big{i}"] for i in range(6))
    assert finished["small"] < first_big and health_done < first_big, (
        f"the small request and /health waited for the big prompts: {finished}"
    )


# --------------------------------------------------------------------------- connections


def _closed_within(sock: socket.socket, bound: float) -> bool:
    sock.settimeout(bound)
    try:
        while sock.recv(4096):
            pass
        return True
    except TimeoutError:
        return False
    except OSError:
        return True


def test_slowloris_and_idle_connections_are_closed(guarded: Frontend) -> None:
    slow = socket.create_connection(("127.0.0.1", guarded.port))
    slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
    idle = socket.create_connection(("127.0.0.1", guarded.port))
    try:
        assert _closed_within(slow, 15), "a connection that never finished its headers stayed open"
        assert _closed_within(idle, 15), "an idle connection stayed open"
    finally:
        slow.close()
        idle.close()
    assert guarded.get("/live").status == 200


def test_the_inflight_cap_answers_503_with_retry_after(guarded: Frontend) -> None:
    auth = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection("127.0.0.1", guarded.port, timeout=HTTP_TIMEOUT)
    body = json.dumps(chat_body(ECHO, "a slow answer", stream=True)).encode()
    conn.request("POST", "/v1/chat/completions", body=body, headers=auth)
    streaming = conn.getresponse()
    assert streaming.status == 200
    streaming.readline()  # the first event: the stream holds its slot
    try:
        body = json.dumps(chat_body(ECHO, "x")).encode()
        refused = http_request(guarded.port, "POST", "/v1/chat/completions", body, auth)
        assert refused.status == 503, refused.body
        assert refused.headers.get("retry-after") == "1"
        assert refused.json()["error"]["type"] == "service_unavailable"
        assert guarded.get("/health").status == 200
    finally:
        conn.close()
    small = json.dumps({"model": ECHO, "prompt": "ok", "max_tokens": 1}).encode()
    wait_until_blocking(
        lambda: http_request(guarded.port, "POST", "/v1/completions", small, auth).status == 200,
        HTTP_TIMEOUT, "the in-flight slot to be released", interval=0.1,
    )


# --------------------------------------------------------------------------- operability


def test_api_key_and_request_ids(guarded: Frontend) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(guarded, "wrong").completions.create(model=ECHO, prompt="hi", max_tokens=1)
    missing = http_request(guarded.port, "GET", "/v1/models")
    assert missing.status == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    for open_path in ("/health", "/live", "/metrics"):
        assert http_request(guarded.port, "GET", open_path).status == 200, open_path
    done = client(guarded, KEY).completions.create(model=ECHO, prompt="hi", max_tokens=1)
    assert done.choices[0].text == "h"

    resp = http_request(guarded.port, "GET", "/live", headers={"x-request-id": "my-id-42"})
    assert resp.headers["x-request-id"] == "my-id-42"
    generated = http_request(guarded.port, "GET", "/live").headers["x-request-id"]
    assert len(generated) == 36
    metrics = http_request(guarded.port, "GET", "/metrics").body.decode()
    assert 'dynamo_frontend_responses_total{endpoint="/v1/models",status="401"}' in metrics


# --------------------------------------------------------------------------- OpenAI semantics


def test_default_max_tokens(echo: Frontend, tiny: Frontend) -> None:
    long_prompt = "x" * 3000
    r = client(echo).completions.create(model=ECHO, prompt=long_prompt)
    assert len(r.choices[0].text) == 1024 and r.choices[0].finish_reason == "length"
    r = client(tiny).chat.completions.create(model=TINY, messages=[{"role": "user", "content": "w5"}])
    assert r.usage.completion_tokens == 7 and r.choices[0].finish_reason == "length"


def test_n_choices(echo: Frontend, tiny: Frontend) -> None:
    r = client(echo).chat.completions.create(model=ECHO, messages=[{"role": "user", "content": "hey"}], n=2)
    assert sorted(c.index for c in r.choices) == [0, 1]
    assert all(c.message.content == "hey" for c in r.choices)
    stream = client(tiny).completions.create(model=TINY, prompt="w5 w6", n=3, max_tokens=4, stream=True)
    seen: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            seen[c.index] = seen.get(c.index, "") + c.text
    assert sorted(seen) == [0, 1, 2]


def test_logprobs_through_the_openai_client(echo: Frontend, tiny: Frontend) -> None:
    r = client(echo).chat.completions.create(
        model=ECHO, messages=[{"role": "user", "content": "abc"}], logprobs=True, top_logprobs=1,
    )
    tokens = r.choices[0].logprobs.content
    assert "".join(t.token for t in tokens) == "abc"
    assert all(t.logprob == 0.0 and t.top_logprobs[0].token == t.token for t in tokens)

    r = client(tiny).chat.completions.create(
        model=TINY, messages=[{"role": "user", "content": "w5"}], max_tokens=5, logprobs=True, top_logprobs=3,
    )
    tokens = r.choices[0].logprobs.content
    assert len(tokens) == 5 and all(t.logprob < 0 and len(t.top_logprobs) == 3 for t in tokens)

    c = client(tiny).completions.create(model=TINY, prompt="w5 w6", max_tokens=4, logprobs=2, stream=True)
    logprob_counts = sum(
        len(ch.choices[0].logprobs.token_logprobs) for ch in c if ch.choices and ch.choices[0].logprobs
    )
    assert logprob_counts == 4


def test_unsupported_fields_are_400s(echo: Frontend) -> None:
    # (`tools` are no longer refused: a token model checks them against its card's
    # tool-call parser, tests/test_tools.py; a chat-level engine like this one gets them.)
    for field, value in [("logit_bias", {"1": 5})]:
        with pytest.raises(openai.BadRequestError, match=field):
            client(echo).chat.completions.create(
                model=ECHO, messages=[{"role": "user", "content": "x"}], **{field: value}
            )
    for field, value in [("best_of", 2), ("suffix", "tail")]:
        with pytest.raises(openai.BadRequestError, match=field):
            client(echo).completions.create(model=ECHO, prompt="x", **{field: value})
    e = post_json(echo.port, "/v1/embeddings", {"model": ECHO, "input": "x"})
    assert e.status == 404 and e.json()["error"]["code"] == "model_not_found"


# --------------------------------------------------------------------------- fuzz


_SEEDS: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {
        "model": ECHO, "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}],
        "max_tokens": 5, "temperature": 0.5, "top_p": 0.9, "n": 1, "stop": ["x"], "stream": False, "seed": 3,
        "logprobs": True, "top_logprobs": 1, "stream_options": {"include_usage": True},
        "response_format": {"type": "json_object"}, "nvext": {"ignore_eos": False, "top_k": 3},
    }),
    ("/v1/completions", {
        "model": ECHO, "prompt": "abc", "max_tokens": 3, "echo": False, "logprobs": 1, "stop": "c", "n": 2,
        "stream": True, "presence_penalty": 0.1, "frequency_penalty": 0.2, "user": "u",
    }),
    ("/v1/embeddings", {"model": ECHO, "input": ["a", "b"]}),
]

_ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 1, 2**31, 2**64, -(2**63), 1.5, -0.0, 1e308, "", "x", "\u0000", "🙂" * 50,
    "a" * 5000, [], [1], ["x", None], {}, {"type": "text"}, {"a": {"b": {"c": []}}}, [[[[[]]]]],
]


def _mutate(rng: random.Random, body: dict[str, Any]) -> bytes:
    doc = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        target: Any = doc
        # Descend into a random nested object or list.
        while isinstance(target, (dict, list)) and target and rng.random() < 0.4:
            key = rng.choice(list(target)) if isinstance(target, dict) else rng.randrange(len(target))
            if not isinstance(target[key], (dict, list)):
                break
            target = target[key]
        if isinstance(target, dict) and target:
            key = rng.choice(list(target))
            if kind < 0.3:
                del target[key]
            else:
                target[key] = copy.deepcopy(rng.choice(_ODD_VALUES))
        elif isinstance(target, list) and target:
            target[rng.randrange(len(target))] = copy.deepcopy(rng.choice(_ODD_VALUES))
        elif isinstance(target, dict):
            field = rng.choice(["n", "tools", "logit_bias", "best_of", "suffix", "zzz"])
            target[field] = copy.deepcopy(rng.choice(_ODD_VALUES))
    data = json.dumps(doc).encode()
    roll = rng.random()
    if roll < 0.1:
        data = data[: rng.randrange(len(data))]
    elif roll < 0.2:
        i = rng.randrange(len(data))
        data = data[:i] + bytes([rng.randrange(256)]) + data[i + 1:]
    return data


def test_fuzzed_bodies_get_no_5xx_and_the_server_survives(echo: Frontend) -> None:
    rng = random.Random(9)
    statuses: dict[int, int] = {}
    conn = http.client.HTTPConnection("127.0.0.1", echo.port, timeout=HTTP_TIMEOUT)
    deadline = time.monotonic() + 60  # a budget for the fuzzing (3000 bodies or 60 s), not a wait
    sent = 0
    try:
        while sent < 3000 and time.monotonic() < deadline:
            path, seed = rng.choice(_SEEDS)
            body = _mutate(rng, seed)
            try:
                conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
                resp = conn.getresponse()
                resp.read()
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", echo.port, timeout=HTTP_TIMEOUT)
                continue
            statuses[resp.status] = statuses.get(resp.status, 0) + 1
            assert resp.status < 500, f"{resp.status} for {path} {body[:500]!r}"
            sent += 1
    finally:
        conn.close()
    rss, peak = rss_bytes(echo.process.proc.pid)
    print(f"fuzz: {sent} bodies, statuses {statuses}, RSS {rss >> 20} MiB, peak {peak >> 20} MiB")
    assert peak < RSS_BOUND_BYTES, f"peak RSS {peak >> 20} MiB"
    assert sent >= 1000, f"only {sent} bodies answered within the bound: {statuses}"
    assert echo.process.proc.poll() is None, "the frontend exited"
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    assert echo.post("/v1/chat/completions", chat_body(ECHO, "still here")).status == 200

"""The OpenAI frontend with local engines (`dynamo-run in=http out=echo_full|echo_core`),
no discovery: the official `openai` client, SSE framing and error codes over raw HTTP,
stop strings split across tokens, 64 concurrent streams, and batch mode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from helpers import WorkerPool
from llm_helpers import (
    DYNAMO_RUN,
    HTTP_TIMEOUT,
    Frontend,
    chat_body,
    http_request,
    launch_frontend,
    local_env,
    sse_data,
    streamed_content,
)

ECHO_MODEL = "echo"
BYTES_MODEL = "bytes"


def _frontend(tmp_path_factory: pytest.TempPathFactory, name: str, out: str, model: str) -> Iterator[Frontend]:
    pool = WorkerPool(local_env(DYN_TOKEN_ECHO_DELAY_MS="1"), tmp_path_factory.mktemp(f"{name}-logs"))
    try:
        frontend = launch_frontend(pool, out, "--model-name", model)
        frontend.wait_live_blocking()
        yield frontend
    finally:
        pool.stop_all()


@pytest.fixture(scope="module")
def echo_full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    """`in=http out=echo_full`, serving model `echo` (one character per token)."""
    yield from _frontend(tmp_path_factory, "echo-full", "echo_full", ECHO_MODEL)


@pytest.fixture(scope="module")
def echo_core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    """`in=http out=echo_core` with the built-in byte-level card (every byte one token):
    it echoes the templated prompt `<|user|>\\n{content}\\n<|assistant|>\\n`."""
    yield from _frontend(tmp_path_factory, "echo-core", "echo_core", BYTES_MODEL)


def client(frontend: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)


# --------------------------------------------------------------------------- openai client


def test_openai_chat(echo_full: Frontend) -> None:
    response = client(echo_full).chat.completions.create(
        model=ECHO_MODEL, messages=[{"role": "user", "content": "hello dynamo"}]
    )
    assert response.object == "chat.completion"
    assert response.model == ECHO_MODEL
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == "hello dynamo"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None
    assert response.usage.completion_tokens == len("hello dynamo")
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_openai_chat_streaming_with_usage(echo_full: Frontend) -> None:
    stream = client(echo_full).chat.completions.create(
        model=ECHO_MODEL,
        messages=[{"role": "system", "content": "ignored"}, {"role": "user", "content": "stream me"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "stream me"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["stop"]
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1, "every chunk of one stream has the same id"
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.completion_tokens == len("stream me")


def test_openai_chat_max_tokens(echo_full: Frontend) -> None:
    response = client(echo_full).chat.completions.create(
        model=ECHO_MODEL, messages=[{"role": "user", "content": "abcdefgh"}], max_tokens=3
    )
    assert response.choices[0].message.content == "abc"
    assert response.choices[0].finish_reason == "length"


def test_openai_completions(echo_full: Frontend) -> None:
    c = client(echo_full)
    response = c.completions.create(model=ECHO_MODEL, prompt="complete this")
    assert response.object == "text_completion"
    assert response.choices[0].text == "complete this"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage is not None and response.usage.completion_tokens == len("complete this")

    chunks = list(c.completions.create(model=ECHO_MODEL, prompt="streamed", stream=True))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == "streamed"
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason] == ["stop"]


def test_openai_models_and_errors(echo_full: Frontend) -> None:
    c = client(echo_full)
    assert [m.id for m in c.models.list().data] == [ECHO_MODEL]
    with pytest.raises(openai.NotFoundError) as not_found:
        c.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "no-such-model" in str(not_found.value)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model=ECHO_MODEL, messages=[{"role": "user", "content": "x"}], max_tokens="many")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- raw HTTP


def test_sse_framing(echo_full: Frontend) -> None:
    response = echo_full.post("/v1/chat/completions", chat_body(ECHO_MODEL, "sse", stream=True))
    assert response.status == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    body = response.body.decode()
    # Events are `data: ...` lines each followed by a blank line; the last is [DONE].
    events = [e for e in body.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), body[:1000]
    assert events[-1] == "data: [DONE]"
    assert body.endswith("\n\n")
    text, chunks = streamed_content(response.body)
    assert text == "sse"
    assert chunks[0]["choices"][0]["delta"].get("role") == "assistant"


def test_completions_sse_framing(echo_full: Frontend) -> None:
    response = echo_full.post("/v1/completions", {"model": ECHO_MODEL, "prompt": "ok", "stream": True})
    assert response.status == 200
    payloads = sse_data(response.body)
    assert payloads[-1] == "[DONE]"
    assert "".join(json.loads(p)["choices"][0]["text"] for p in payloads[:-1] if json.loads(p)["choices"]) == "ok"


def _assert_error(response: object, status: int, kind: str) -> dict[str, object]:
    assert response.status == status, response  # type: ignore[attr-defined]
    assert response.headers["content-type"].startswith("application/json")  # type: ignore[attr-defined]
    error = response.json()["error"]  # type: ignore[attr-defined]
    assert set(error) >= {"message", "type", "param", "code"}, error
    assert error["type"] == kind and error["message"]
    return error


def test_error_codes(echo_full: Frontend) -> None:
    headers = {"Content-Type": "application/json"}
    truncated = b'{"model": "echo", "messages": ['
    malformed = http_request(echo_full.port, "POST", "/v1/chat/completions", truncated, headers)
    _assert_error(malformed, 400, "invalid_request_error")

    wrong_type = echo_full.post("/v1/chat/completions", chat_body(ECHO_MODEL, "x", max_tokens="ten"))
    error = _assert_error(wrong_type, 400, "invalid_request_error")
    assert "max_tokens" in str(error["message"]) + str(error["param"])

    messages_not_a_list = echo_full.post("/v1/chat/completions", {"model": ECHO_MODEL, "messages": "hi"})
    _assert_error(messages_not_a_list, 400, "invalid_request_error")

    unknown = echo_full.post("/v1/chat/completions", chat_body("nope", "x"))
    error = _assert_error(unknown, 404, "not_found_error")
    assert error["code"] == "model_not_found" and "nope" in str(error["message"])
    unknown = echo_full.post("/v1/completions", {"model": "nope", "prompt": "x", "stream": True})
    _assert_error(unknown, 404, "not_found_error")

    assert echo_full.get("/health").status == 200
    assert echo_full.get("/live").status == 200
    assert http_request(echo_full.port, "GET", "/no/such/route").status == 404


# --------------------------------------------------------------------------- stop strings


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_split_across_tokens(echo_core: Frontend, stream: bool) -> None:
    # Every byte is a token, so "world" arrives as five tokens: the detokenizer must hold
    # back "w", "wo", ... until it knows whether the stop string completes.
    body = chat_body(BYTES_MODEL, "hello wonderful world, more text", stop=["world"], stream=stream)
    response = echo_core.post("/v1/chat/completions", body)
    assert response.status == 200, response.body
    if stream:
        text, chunks = streamed_content(response.body)
        finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    else:
        choice = response.json()["choices"][0]
        text, finish = choice["message"]["content"], [choice["finish_reason"]]
    assert "world" not in text
    assert text.endswith("hello wonderful "), text
    assert finish == ["stop"]


def test_stop_strings_first_match_wins(echo_core: Frontend) -> None:
    body = {"model": BYTES_MODEL, "prompt": "alpha beta gamma delta", "stop": ["delta", "ta g"]}
    response = echo_core.post("/v1/completions", body)
    assert response.status == 200, response.body
    text = response.json()["choices"][0]["text"]
    assert text.endswith("alpha be"), text
    assert "ta g" not in text and "delta" not in text


# --------------------------------------------------------------------------- concurrency


async def test_64_concurrent_streams(echo_full: Frontend) -> None:
    async_client = openai.AsyncOpenAI(base_url=echo_full.base_url, api_key="unused", max_retries=0, timeout=60)

    async def one(i: int) -> str:
        stream = await async_client.chat.completions.create(
            model=ECHO_MODEL, messages=[{"role": "user", "content": f"stream number {i} says hi"}], stream=True
        )
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    try:
        texts = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(64))), 60)
    finally:
        await async_client.close()
    assert texts == [f"stream number {i} says hi" for i in range(64)]


# --------------------------------------------------------------------------- batch


async def test_batch_mode(workers_local: WorkerPool, tmp_path: Path) -> None:
    prompts = ["first prompt", "the second one", "3"]
    batch = tmp_path / "prompts.jsonl"
    batch.write_text("".join(json.dumps({"text": p}) + "\n" for p in prompts))
    run = workers_local.command([*DYNAMO_RUN, f"in=batch:{batch}", "out=echo_full"], name="batch")
    assert await run.wait_exit(60) == 0, run.describe()
    lines = [json.loads(line) for line in (tmp_path / "output.jsonl").read_text().splitlines()]
    assert sorted(line["text"] for line in lines) == sorted(prompts)
    for line in lines:
        assert line["response"] == line["text"]
        assert line["tokens_out"] == len(line["text"])
        assert line["tokens_in"] > 0
        assert line["finish_reason"] == "stop"
        assert line["elapsed_ms"] >= 0

"""Tool calling and reasoning output through the HTTP frontend (issue 24), with real
processes and no mocks.

Deterministic output comes from `echo_core`, which sends the prompt's tokens back: with
`nvext.use_raw_prompt` the last user message is the prompt, so the "model" writes exactly
the markup a test puts there. Locally (`dynamo-run in=http out=echo_core` with the
parser flags) that covers streamed and whole responses, the official `openai` client's
tool loop, finish reasons, a stream cut inside a call and the 400s. Over discovery, on
both backends, a mocker registered with `--tool-call-parser hermes` and an echo worker
registered the same way serve tools through `dynamo-run in=http out=dyn`: the parser
travels in the model card.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import WorkerPool
from llm_helpers import (
    DYNAMO_RUN,
    HTTP_TIMEOUT,
    MOCKER,
    Frontend,
    launch_frontend,
    local_env,
    start_frontend,
    start_mocker,
    streamed_content,
    write_json,
)

pytestmark = pytest.mark.timeout(150)

MODEL = "bytes"
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich \\"ZH\\""}}</tool_call>'
ANSWER = f"<think>the user wants weather</think>Let me check.{CALL}"


@pytest.fixture(scope="module")
def parsing(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    """`in=http out=echo_core` (built-in byte-level card) with both parsers (`qwen3`:
    output without a `<think>` block is all content)."""
    pool = WorkerPool(local_env(DYN_TOKEN_ECHO_DELAY_MS="0"), tmp_path_factory.mktemp("tools-logs"))
    try:
        frontend = launch_frontend(pool, "echo_core", "--model-name", MODEL, "--tool-call-parser", "hermes",
                                   "--reasoning-parser", "qwen3", "--enable-auto-tool-choice")
        frontend.wait_live_blocking()
        yield frontend
    finally:
        pool.stop_all()


def echoed(text: str, thinking: bool = False, **extra: Any) -> dict[str, Any]:
    """A chat request whose "model output" is `text` (echo_core with the raw prompt).
    Without `thinking`, Qwen3's switch is off for the request: output that opens no
    `<think>` block is then content (with it on, it would be unfinished thinking)."""
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "tools": [WEATHER],
            "nvext": {"use_raw_prompt": True}, "chat_template_kwargs": {"enable_thinking": thinking}, **extra}


def client(frontend: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)


def assert_weather_call(call: Any) -> None:
    assert call["type"] == "function"
    assert call["id"].startswith("call_") and len(call["id"]) == 29
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": 'Zürich "ZH"'}


def test_a_whole_response_splits_reasoning_content_and_calls(parsing: Frontend) -> None:
    response = parsing.post("/v1/chat/completions", echoed(ANSWER, thinking=True))
    assert response.status == 200, response.body
    choice = response.json()["choices"][0]
    message = choice["message"]
    assert message["reasoning_content"] == "the user wants weather"
    assert message["content"] == "Let me check."
    assert len(message["tool_calls"]) == 1
    assert_weather_call(message["tool_calls"][0])
    assert choice["finish_reason"] == "tool_calls"


def test_a_stream_carries_each_call_whole_and_no_markup_in_content(parsing: Frontend) -> None:
    response = parsing.post("/v1/chat/completions", echoed(ANSWER + CALL, thinking=True, stream=True,
                                                           stream_options={"include_usage": True}))
    assert response.status == 200, response.body
    content, chunks = streamed_content(response.body)
    # Every token is counted, also those of text held back inside the calls.
    whole = parsing.post("/v1/chat/completions", echoed(ANSWER + CALL, thinking=True)).json()
    assert chunks[-1]["usage"] == whole["usage"]
    chunks = chunks[:-1]
    assert content == "Let me check."
    reasoning = "".join(c["choices"][0]["delta"].get("reasoning_content") or "" for c in chunks)
    assert reasoning == "the user wants weather"
    calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]
    assert [c["index"] for c in calls] == [0, 1]
    for call in calls:
        assert_weather_call(call)
    assert calls[0]["id"] != calls[1]["id"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    # Text held back inside a call sends no empty chunks (its tokens count in the next one).
    empty = [c for c in chunks[1:] if c["choices"] and c["choices"][0]["delta"] == {}
             and c["choices"][0]["finish_reason"] is None]
    assert empty == []


def test_a_stream_cut_inside_a_call_ends_with_length_and_no_half_call(parsing: Frontend) -> None:
    text = "Sure." + CALL
    # The byte-level card: one token per byte; cut in the middle of the arguments.
    cut = len(("Sure." + CALL[:40]).encode())
    for stream in (False, True):
        response = parsing.post("/v1/chat/completions", echoed(text, max_tokens=cut, stream=stream))
        assert response.status == 200, response.body
        if stream:
            content, chunks = streamed_content(response.body)
            assert not any(c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"])
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            message = response.json()["choices"][0]["message"]
            assert "tool_calls" not in message
            content, finish = message["content"], response.json()["choices"][0]["finish_reason"]
        assert finish == "length"
        assert content.startswith("Sure.") and len(content) <= cut


def test_malformed_markup_and_unknown_functions_come_back_as_content(parsing: Frontend) -> None:
    for text in ('<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
                 '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'):
        response = parsing.post("/v1/chat/completions", echoed(text))
        assert response.status == 200, response.body
        choice = response.json()["choices"][0]
        assert "tool_calls" not in choice["message"]
        assert choice["message"]["content"] == text
        assert choice["finish_reason"] == "stop"


def test_required_and_named_choices_read_the_constrained_json_as_calls(parsing: Frontend) -> None:
    # echo_core ignores the JSON-schema constraint; the "model" writes the JSON itself.
    required = echoed('[{"name": "get_weather", "parameters": {"city": "Zürich \\"ZH\\""}}]', tool_choice="required")
    named = echoed('{"city": "Zürich \\"ZH\\""}', tool_choice={"type": "function", "function": {"name": "get_weather"}})
    for body in (required, named):
        for stream in (False, True):
            response = parsing.post("/v1/chat/completions", {**body, "stream": stream})
            assert response.status == 200, response.body
            if stream:
                content, chunks = streamed_content(response.body)
                calls = [call for c in chunks for call in c["choices"][0]["delta"].get("tool_calls") or []]
                finish = chunks[-1]["choices"][0]["finish_reason"]
            else:
                message = response.json()["choices"][0]["message"]
                content, calls = message["content"] or "", message["tool_calls"]
                finish = response.json()["choices"][0]["finish_reason"]
            assert content == ""
            assert len(calls) == 1
            assert_weather_call(calls[0])
            assert finish == "tool_calls"


def test_the_openai_client_runs_a_two_turn_tool_loop_unchanged(parsing: Frontend) -> None:
    c = client(parsing)
    messages: list[Any] = [{"role": "user", "content": ANSWER}]
    first = c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],  # type: ignore[arg-type]
                                      extra_body={"nvext": {"use_raw_prompt": True}})
    assert first.choices[0].message.reasoning_content == "the user wants weather"  # type: ignore[attr-defined]
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": 'Zürich "ZH"'}
    # Turn two: the assistant's call and the tool's result go back in the history.
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "18 degrees"})
    messages.append({"role": "user", "content": "It is 18 degrees in Zürich."})
    no_thinking = {"chat_template_kwargs": {"enable_thinking": False}}
    second = c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],  # type: ignore[arg-type]
                                       extra_body={"nvext": {"use_raw_prompt": True}, **no_thinking})
    assert second.choices[0].message.content == "It is 18 degrees in Zürich."
    assert not second.choices[0].message.tool_calls
    assert second.choices[0].finish_reason == "stop"
    # The same history rendered by the template (no raw prompt) is accepted too.
    stream = c.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER],  # type: ignore[arg-type]
                                       stream=True, extra_body=no_thinking)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "<|tool|>\n18 degrees" in text


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]},
         "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
         "tool_choice.function.name"),
        ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
         "response_format"),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_field(parsing: Frontend, fields: dict[str, Any], message: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    response = parsing.post("/v1/chat/completions", body)
    assert response.status == 400, response.body
    assert message in response.json()["error"]["message"]
    # The frontend keeps serving.
    assert parsing.post("/v1/chat/completions", echoed("still here")).status == 200


def test_auto_for_a_model_without_a_tool_call_parser_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    pool = WorkerPool(local_env(), tmp_path / "logs")
    try:
        plain = launch_frontend(pool, "echo_core", "--model-name", MODEL)
        plain.wait_live_blocking()
        response = plain.post("/v1/chat/completions", echoed("hi"))
        assert response.status == 400, response.body
        assert "tool_call_parser" in response.json()["error"]["message"]
        assert "--tool-call-parser" in response.json()["error"]["message"]
        # required / named need no parser; none renders no tools and parses nothing.
        ok = plain.post("/v1/chat/completions", echoed('{"city": "x"}', tool_choice={
            "type": "function", "function": {"name": "get_weather"}}))
        assert ok.status == 200, ok.body
        assert ok.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        none = plain.post("/v1/chat/completions", echoed(CALL, tool_choice="none"))
        assert none.status == 200 and none.json()["choices"][0]["message"]["content"] == CALL
    finally:
        pool.stop_all()


def test_unknown_parser_names_fail_at_start_with_the_known_ones(tmp_path: Path) -> None:
    import subprocess

    for flag, name, known in (("--tool-call-parser", "hermes2", "llama3_json"), ("--reasoning-parser", "r1", "qwen3")):
        done = subprocess.run([*DYNAMO_RUN, "in=http", "out=echo_core", flag, name], capture_output=True, text=True,
                              timeout=60, env=local_env())
        assert done.returncode == 2, done.stderr
        assert name in done.stderr and known in done.stderr
    for flag, name in (("--tool-call-parser", "hermes2"), ("--reasoning-parser", "r1")):
        done = subprocess.run([*MOCKER, flag, name],
                              capture_output=True, text=True, timeout=60, env=local_env())
        assert done.returncode == 2, done.stderr
        assert "known:" in done.stderr


# --------------------------------------------------------------------------- over discovery


async def test_workers_registered_with_a_parser_serve_tools_through_out_dyn(
    workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    fast = write_json(tmp_path / "fast.json", {"speedup_ratio": 20.0})
    start_mocker(workers, f"{namespace}.mocker.generate", model_dir, "--model-name", "mock",
                 "--tool-call-parser", "hermes", "--enable-auto-tool-choice", "--extra-engine-args", str(fast))
    start_mocker(workers, f"{namespace}.plain.generate", model_dir, "--model-name", "plain",
                 "--extra-engine-args", str(fast), name="plain")
    workers.command([*DYNAMO_RUN, f"in=dyn://{namespace}.echo.generate", "out=echo_core", "--model-name", "echo",
                     "--tool-call-parser", "hermes", "--reasoning-parser", "deepseek_r1"], name="echo")
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models(["echo", "mock", "plain"])

    def post(body: dict[str, Any]) -> Any:
        return frontend.post("/v1/chat/completions", body)

    # The echo worker's card carries both parsers: the frontend splits its output.
    response = await asyncio.to_thread(post, {**echoed(ANSWER), "model": "echo"})
    assert response.status == 200, response.body
    message = response.json()["choices"][0]["message"]
    assert (message["reasoning_content"], message["content"]) == ("the user wants weather", "Let me check.")
    assert_weather_call(message["tool_calls"][0])
    assert response.json()["choices"][0]["finish_reason"] == "tool_calls"

    # The mocker (random words) with tools: a normal answer, streamed and whole.
    for stream in (False, True):
        body = {"model": "mock", "messages": [{"role": "user", "content": "w5 w6"}], "tools": [WEATHER],
                "max_tokens": 8, "stream": stream}
        response = await asyncio.to_thread(post, body)
        assert response.status == 200, response.body
        if stream:
            content, chunks = streamed_content(response.body)
            finish = chunks[-1]["choices"][0]["finish_reason"]
        else:
            content = response.json()["choices"][0]["message"]["content"]
            finish = response.json()["choices"][0]["finish_reason"]
        assert content and "<tool_call>" not in content
        assert finish in ("length", "stop")

    # A model registered without a parser: auto is a 400 naming the setting; the
    # worker keeps serving.
    body = {"model": "plain", "messages": [{"role": "user", "content": "w5"}], "tools": [WEATHER], "max_tokens": 4}
    response = await asyncio.to_thread(post, body)
    assert response.status == 400 and "tool_call_parser" in response.json()["error"]["message"]
    response = await asyncio.to_thread(post, {**body, "tool_choice": "none"})
    assert response.status == 200, response.body
    bad = {**body, "model": "mock", "tools": [{"type": "function", "function": {}}]}
    response = await asyncio.to_thread(post, bad)
    assert response.status == 400 and "tools[0].function.name" in response.json()["error"]["message"]


def test_the_sdk_worker_config_passes_the_parser_settings_to_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo.mocker.__main__ import dynamo_run_argv, parse_args
    from dynamo.sdk.lib.config import ServiceConfig

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples" / "llm"))
    from components.worker import engine_argv

    config = ServiceConfig({"Worker": {"engine": "mocker", "tool-call-parser": "hermes", "reasoning-parser": "qwen3",
                                       "enable-auto-tool-choice": True}})
    argv = engine_argv("Worker", config)
    args = parse_args(argv)
    assert (args.tool_call_parser, args.reasoning_parser, args.enable_auto_tool_choice) == ("hermes", "qwen3", True)
    run = dynamo_run_argv(args, None)
    assert run[run.index("--tool-call-parser") + 1] == "hermes"
    assert run[run.index("--reasoning-parser") + 1] == "qwen3"

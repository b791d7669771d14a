"""Tool calling on the real engine (issue 24): ``dynamo-run in=http out=vllm`` serving the
tiny random-weight model with a tool-capable chat template (``tool_fixtures``: one that
renders ``tools`` with ``tojson``, as real templates do) and ``--tool-call-parser
hermes``, beside vLLM's own server started with the same template and parser.
``tool_choice`` required and named, streamed and not, return calls whose arguments the
tools' schemas accept — from a model whose text is gibberish, because the frontend
constrains the engine to the calls' JSON, without free whitespace; ``auto``, also after
a tool result in the history, answers what vLLM's server answers; and the official
``openai`` client runs a two-turn tool loop unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from engine_fleet import (
    ENGINE_FLAGS,
    MODEL,
    engine_env,
    launch_vllm_server,
    models_of,
    stop_all,
    wait_http,
    wait_vllm_server,
)
from helpers import WorkerPool, free_port
from llm_helpers import DYNAMO_RUN, local_env, post_json, streamed_content
from tool_fixtures import SCHEMAS, TOOL_TEMPLATE, TOOLS

pytestmark = pytest.mark.timeout(300)


class Served:
    """Our server (``port``, ``client``) and vLLM's (``vllm_port``) on the same model."""

    def __init__(self, port: int, vllm_port: int):
        self.port = port
        self.vllm_port = vllm_port
        self.client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0,
                                    timeout=120)


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("vllm-tools")
    template = root / "tools.jinja"
    template.write_text(TOOL_TEMPLATE)
    pool = WorkerPool(engine_env(local_env(DYN_FILE_KV=str(root / "kv"))), root)
    port = free_port()
    argv = [
        *DYNAMO_RUN, "in=http", "out=vllm", "--model-path", str(tiny_model), "--model-name", MODEL,
        "--http-port", str(port), "--chat-template", str(template), "--tool-call-parser", "hermes",
        "--", *ENGINE_FLAGS,
    ]
    try:  # also when a start fails: no engine outlives the module
        process = pool.command(argv, name="dynamo-run-vllm-tools")
        vllm_server, vllm_port = launch_vllm_server(
            pool, tiny_model, "--chat-template", str(template), "--tool-call-parser", "hermes",
            "--enable-auto-tool-choice", "--seed", "0",
        )
        wait_http(process, port, "/v1/models", lambda r: models_of(r) == [MODEL])
        wait_vllm_server(vllm_server, vllm_port)
        yield Served(port, vllm_port)
    finally:
        stop_all(pool)


def calls_of(port: int, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """(calls, content, finish_reason) of a chat request, streamed or whole."""
    response = post_json(port, "/v1/chat/completions", body, timeout=120)
    assert response.status == 200, response.body
    if body.get("stream"):
        content, chunks = streamed_content(response.body)
        calls = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls") or []]
        return calls, content, chunks[-1]["choices"][0]["finish_reason"]
    choice = response.json()["choices"][0]
    return choice["message"].get("tool_calls") or [], choice["message"]["content"] or "", choice["finish_reason"]


def assert_valid(call: dict[str, Any], name: str | None = None) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    function = call["function"]
    assert function["name"] in SCHEMAS if name is None else function["name"] == name
    jsonschema.validate(json.loads(function["arguments"]), SCHEMAS[function["name"]])


@pytest.mark.parametrize("stream", [False, True])
def test_required_returns_calls_the_schemas_accept(served: Served, stream: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": TOOLS,
            "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64, "temperature": 0,
            "stream": stream}
    calls, content, finish = calls_of(served.port, body)
    assert len(calls) == 1, (calls, content, finish)
    assert_valid(calls[0])
    assert content == ""
    assert finish == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
def test_a_named_function_returns_its_call(served: Served, stream: bool) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What time is it?"}], "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "clock"}}, "max_tokens": 64, "temperature": 0,
            "stream": stream}
    calls, content, finish = calls_of(served.port, body)
    assert len(calls) == 1, (calls, content, finish)
    assert_valid(calls[0], "clock")
    assert finish == "tool_calls"


def test_auto_with_gibberish_is_plain_content(served: Served) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Weather?"}], "tools": TOOLS,
            "max_tokens": 16, "temperature": 0}
    calls, content, finish = calls_of(served.port, body)
    assert calls == [] and content and "<tool_call>" not in content
    assert finish == "length"


#: ``auto`` conversations: a first turn, and one after a call and its result.
AUTO_CONVERSATIONS = {
    "first turn": [{"role": "user", "content": "Weather in Paris?"}],
    "after a tool result": [
        {"role": "user", "content": "Weather in Oslo, in Celsius?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function", "function": {
            "name": "forecast", "arguments": '{"city": "Oslo", "metric": true}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "12 degrees, light rain"},
    ],
}


def answer_of(port: int, body: dict[str, Any]) -> tuple[str, list[tuple[str, Any]], str]:
    """(content, calls as (name, parsed arguments), finish_reason): ids differ by server."""
    calls, content, finish = calls_of(port, body)
    return content, [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls], finish


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("conversation", list(AUTO_CONVERSATIONS))
def test_auto_answers_what_vllms_server_answers(served: Served, conversation: str, stream: bool) -> None:
    body = {"model": MODEL, "messages": AUTO_CONVERSATIONS[conversation], "tools": TOOLS, "tool_choice": "auto",
            "max_tokens": 24, "temperature": 0, "seed": 0, "stream": stream}
    ours = answer_of(served.port, body)
    assert ours[0], ours  # the model said something: the comparison is not of two empty answers
    assert ours == answer_of(served.vllm_port, body)


def test_the_openai_client_runs_a_two_turn_tool_loop(served: Served) -> None:
    messages: list[Any] = [{"role": "user", "content": "Weather in Oslo?"}]
    first = served.client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required",  # type: ignore[arg-type]
        parallel_tool_calls=False, max_tokens=64, temperature=0,
    )
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    calls = message.tool_calls or []
    assert len(calls) == 1
    arguments = json.loads(calls[0].function.arguments)
    jsonschema.validate(arguments, SCHEMAS[calls[0].function.name])
    messages.append(message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": calls[0].id, "content": "12 degrees"})
    second = served.client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=8, temperature=0,  # type: ignore[arg-type]
    )
    assert second.choices[0].finish_reason == "length"
    assert second.choices[0].message.content and not second.choices[0].message.tool_calls

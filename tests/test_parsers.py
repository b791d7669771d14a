"""The output parsers from Python (docs/tools.md): ``dynamo.llm.parse_tool_calls``,
``parse_reasoning`` and the stream forms, on the shared corpus, whole and streamed."""

from __future__ import annotations

import json

import pytest
from dynamo.llm import (
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    ReasoningStream,
    ToolCallStream,
    parse_reasoning,
    parse_tool_calls,
)
from parser_corpus import REASONING_CASES, TOOL_CASES, ReasoningCase, ToolCase


def normalized(calls: list[dict]) -> list[tuple[str, dict]]:
    return [(c["name"], json.loads(c["arguments"])) for c in calls]


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda c: c.id)
def test_tool_calls_whole(case: ToolCase) -> None:
    content, calls = parse_tool_calls(case.parser, case.text, case.tools)
    assert (content, normalized(calls)) == (case.content, case.calls)
    assert all(set(c) == {"name", "arguments"} for c in calls)


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda c: c.id)
def test_tool_calls_streamed_per_character(case: ToolCase) -> None:
    stream = ToolCallStream(case.parser, case.tools)
    content, deltas = "", []
    for ch in case.text:
        piece, calls = stream.push(ch)
        content += piece
        deltas += calls
    piece, calls = stream.finish()
    content += piece
    deltas += calls
    assert not stream.cut
    assert [d["index"] for d in deltas] == list(range(len(deltas)))
    assert all(d["id"].startswith("call_") and d["type"] == "function" for d in deltas)
    calls_seen = [{"name": d["function"]["name"], "arguments": d["function"]["arguments"]} for d in deltas]
    assert (content or None, normalized(calls_seen)) == (case.content, case.calls)


def test_a_stream_cut_inside_a_call_is_flagged() -> None:
    stream = ToolCallStream("hermes")
    assert stream.push('Hi <tool_call>{"name": "f", "argu') == ("Hi ", [])
    assert stream.finish() == ('<tool_call>{"name": "f", "argu', [])
    assert stream.cut


@pytest.mark.parametrize("case", REASONING_CASES, ids=lambda c: c.id)
def test_reasoning_whole_and_streamed(case: ReasoningCase) -> None:
    assert parse_reasoning(case.parser, case.text, case.enable_thinking) == (case.reasoning, case.content)
    stream = ReasoningStream(case.parser, case.enable_thinking)
    reasoning, content = "", ""
    for ch in case.text:
        r, c = stream.push(ch)
        reasoning, content = reasoning + r, content + c
    r, c = stream.finish()
    assert (reasoning + r or None, content + c or None) == (case.reasoning, case.content)


def test_unknown_names_list_the_known_ones() -> None:
    assert "hermes" in TOOL_CALL_PARSERS and "qwen3" in REASONING_PARSERS
    with pytest.raises(ValueError, match=r'unknown tool-call parser "nope"; known: deepseek_v3, hermes, llama3_json'):
        parse_tool_calls("nope", "x")
    with pytest.raises(ValueError, match=r'unknown reasoning parser "nope"; known: deepseek_r1, qwen3'):
        ReasoningStream("nope")

"""Our output parsers against vLLM's own (``vllm.tool_parsers``, ``vllm.reasoning``) on
the shared corpus (``tests/parser_corpus.py``): the same calls (arguments compared as
JSON), content and reasoning. A case marked ``differs`` is one where we differ on
purpose (docs/tools.md lists them): there the test checks that vLLM still gives
something else, so the list stays true.

No engine starts here; vLLM's parsers need a tokenizer that has their markup as
tokens: the test model's, with the markup added as special tokens.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from dynamo.llm import parse_reasoning, parse_tool_calls
from parser_corpus import REASONING_CASES, TOOL_CASES, ReasoningCase, ToolCase, ds_marker

TOKENIZER_DIR = "/work/shared/models/tinyllama-chat"
MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "<think>",
    "</think>",
    *(ds_marker(w) for w in ("tool calls begin", "tool calls end", "tool call begin", "tool call end", "tool sep")),
]


@cache
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tok.add_special_tokens({"additional_special_tokens": MARKUP})
    return tok


def request(tools: list[str] | None) -> Any:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    names = tools or ["f"]
    return ChatCompletionRequest(
        model="m",
        messages=[{"role": "user", "content": "hi"}],
        tools=[{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names],
    )


def vllm_tool_calls(case: ToolCase) -> tuple[str | None, list[tuple[str, Any]]]:
    from vllm.tool_parsers import ToolParserManager

    parser = ToolParserManager.get_tool_parser(case.parser)(tokenizer())
    result = parser.extract_tool_calls(case.text, request(case.tools))
    calls = []
    for c in result.tool_calls:
        try:
            calls.append((c.function.name, json.loads(c.function.arguments)))
        except json.JSONDecodeError:
            calls.append((c.function.name, c.function.arguments))
    return result.content, calls


def ours(case: ToolCase) -> tuple[str | None, list[tuple[str, Any]]]:
    content, calls = parse_tool_calls(case.parser, case.text, case.tools)
    return content, [(c["name"], json.loads(c["arguments"])) for c in calls]


@pytest.mark.parametrize("case", TOOL_CASES, ids=lambda c: c.id)
def test_tool_calls_match_vllm(case: ToolCase) -> None:
    mine, theirs = ours(case), vllm_tool_calls(case)
    assert mine == (case.content, case.calls)
    if case.differs:
        assert theirs != mine, f"vLLM now agrees on {case.id}: drop its 'differs' note"
    else:
        assert theirs == mine


def vllm_reasoning(case: ReasoningCase) -> tuple[str | None, str | None]:
    from vllm.reasoning import ReasoningParserManager

    cls = ReasoningParserManager.get_reasoning_parser(case.parser)
    kwargs = {"chat_template_kwargs": {"enable_thinking": case.enable_thinking}} if case.parser == "qwen3" else {}
    parser = cls(tokenizer(), **kwargs)
    return parser.extract_reasoning(case.text, request(None))


@pytest.mark.parametrize("case", REASONING_CASES, ids=lambda c: c.id)
def test_reasoning_matches_vllm(case: ReasoningCase) -> None:
    mine = parse_reasoning(case.parser, case.text, case.enable_thinking)
    assert mine == (case.reasoning, case.content)
    theirs = vllm_reasoning(case)
    if case.differs:
        assert theirs != mine, f"vLLM now agrees on {case.id}: drop its 'differs' note"
    else:
        assert theirs == mine

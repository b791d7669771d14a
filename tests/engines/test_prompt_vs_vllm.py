"""The prompt our frontend renders for a chat request with tools equals the one vLLM's
OpenAI server renders (issue 24 item 1): the same template, the same tools (as vLLM
dumps them: ``tool.model_dump()`` of its request model), the same messages (tool calls
with their arguments as mappings, tool results) and the same ``tojson`` text (the
client's key order, Python's separators, unicode as written, ``indent``).

No engine starts: vLLM's side is the code its server renders with (its request model,
``parse_chat_messages`` and ``safe_apply_chat_template``), ours the Rust preprocessor
(``OpenAIPreprocessor``), both on the tier's tiny model.
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from tool_fixtures import TOOL_TEMPLATE, TOOLS

#: A template that writes every value the template gets with ``tojson``, in each of
#: transformers' forms (Llama 3.1's templates use ``indent=4``): the tools, and whole
#: messages, so a key out of order or a field too many shows.
DUMP_TEMPLATE = (
    "{% for tool in tools or [] %}{{ tool | tojson(indent=4) }}\n{{ tool | tojson(sort_keys=true) }}\n{% endfor %}"
    "{% for m in messages %}{{ m | tojson }}\n{{ m | tojson(ensure_ascii=true, separators=(',', ':')) }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

NESTED = {
    "type": "function",
    "function": {
        "name": "book_trip",
        "description": "Réserver un voyage — 日本語 too",
        "parameters": {
            "type": "object",
            "properties": {
                "to": {"type": "string", "description": "city, e.g. \"Zürich\""},
                "legs": {"type": "array", "items": {"type": "object", "properties": {
                    "day": {"type": "integer", "minimum": 1}, "seat": {"enum": ["A", "B"]}}}},
                "budget": {"type": "number", "maximum": 1e6, "multipleOf": 0.01},
            },
            "required": ["to"],
        },
    },
}
#: No description nor parameters, a `strict` flag and a field vLLM's model drops.
BARE = {"function": {"name": "ping", "strict": True, "x-extra": 1}, "type": "function"}

HISTORY = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Book Zürich, then ping."},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "book_trip", "arguments": '{"to": "Zürich", "legs": [{"seat": "A", "day": 2}]}'}},
        {"type": "function", "id": "call_2", "function": {"arguments": "{}", "name": "ping"}},
    ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "booked ✓"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "pong"}]},
    {"role": "user", "content": [{"type": "text", "text": "And now?"}, {"type": "text", "text": "Be brief."}]},
]

REQUESTS = {
    "tools with descriptions, nested parameters, unicode": {
        "messages": [{"role": "user", "content": "Plan ✈ to 東京"}], "tools": [NESTED, *TOOLS]},
    "a tool with no description nor parameters": {
        "messages": [{"role": "user", "content": "ping?"}], "tools": [BARE]},
    "calls and tool results in the history": {"messages": HISTORY, "tools": [NESTED, BARE]},
    "no tools": {"messages": HISTORY[:2]},
}


@cache
def vllm_side(model: Path) -> tuple[Any, Any]:
    """vLLM's model config and tokenizer for ``model`` (no engine)."""
    from vllm.config import ModelConfig
    from vllm.tokenizers import get_tokenizer

    return ModelConfig(model=str(model)), get_tokenizer(str(model))


def vllm_prompt(model: Path, template: str, body: dict[str, Any]) -> str:
    """The prompt vLLM's chat server renders for ``body`` with ``template`` (as its
    ``render_chat`` and ``preprocess_chat`` do it, minus tokenizing)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.chat_utils import parse_chat_messages
    from vllm.renderers.hf import resolve_chat_template_content_format, safe_apply_chat_template

    model_config, tokenizer = vllm_side(model)
    request = ChatCompletionRequest.model_validate({"model": "m", **copy.deepcopy(body)})
    tool_dicts = None if request.tools is None else [tool.model_dump() for tool in request.tools]
    params = request.build_chat_params(template, "auto").with_defaults({"tools": tool_dicts, "tokenize": False})
    content_format = resolve_chat_template_content_format(
        chat_template=template, tools=tool_dicts, given_format="auto", tokenizer=tokenizer, model_config=model_config
    )
    assert content_format == "string"  # what our frontend gives templates
    conversation, _, _ = parse_chat_messages(request.messages, model_config, content_format=content_format)
    return safe_apply_chat_template(model_config, tokenizer, conversation, **params.get_apply_chat_template_kwargs())


@pytest.mark.parametrize("template", [TOOL_TEMPLATE, DUMP_TEMPLATE], ids=["tier-template", "tojson-everything"])
@pytest.mark.parametrize("case", list(REQUESTS))
def test_the_prompt_is_the_one_vllm_renders(tiny_model: Path, tmp_path: Path, template: str, case: str) -> None:
    from dynamo.llm import OpenAIPreprocessor

    body = REQUESTS[case]
    template_file = tmp_path / "template.jinja"
    template_file.write_text(template)
    ours = OpenAIPreprocessor(
        model_path=tiny_model, context_length=16384, chat_template=template_file, tool_call_parser="hermes"
    )
    prompt = ours.preprocess({"model": "m", **copy.deepcopy(body)}).prompt
    assert prompt == vllm_prompt(tiny_model, template, body)

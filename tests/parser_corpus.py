"""The output parsers' corpus (docs/tools.md): model outputs per tool-call format and
per reasoning format, with what our parsers make of them. ``tests/test_parsers.py``
checks ours; ``tests/engines/test_parsers_vs_vllm.py`` checks vLLM's own parsers agree,
except where a case says why we differ on purpose.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ToolCase:
    """One model output for a tool-call parser."""

    id: str
    parser: str
    text: str
    #: Our content (``None`` when there is none).
    content: str | None
    #: Our calls: ``(name, arguments)``, the arguments compared as parsed JSON.
    calls: list[tuple[str, dict]] = field(default_factory=list)
    #: The request's function names (``None``: any).
    tools: list[str] | None = None
    #: Why vLLM's parser gives something else, when it does on purpose.
    differs: str | None = None


@dataclass(frozen=True)
class ReasoningCase:
    """One model output for a reasoning parser."""

    id: str
    parser: str
    text: str
    reasoning: str | None
    content: str | None
    enable_thinking: bool = True
    differs: str | None = None


ARGS = {"q": 'say "hi" {', "nested": {"list": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}
ARGS_JSON = '{"q": "say \\"hi\\" {", "nested": {"list": [1, {"k": "v"}]}, "city": "Zürich 東京 🦀"}'
ARGS_PY = 'q="say \\"hi\\" {", nested={"list": [1, {"k": "v"}]}, city="Zürich 東京 🦀"'


def ds_marker(words: str) -> str:
    """A DeepSeek-V3 markup token from its words: ``tool calls begin`` is the token
    written with fullwidth bars (U+FF5C) around the words joined by U+2581."""
    return "<\uff5c" + words.replace(" ", "\u2581") + "\uff5c>"


DS_CALLS_BEGIN, DS_CALLS_END = ds_marker("tool calls begin"), ds_marker("tool calls end")


def ds_call(name: str, args: str) -> str:
    """One DeepSeek-V3 call's markup."""
    begin, sep, end = ds_marker("tool call begin"), ds_marker("tool sep"), ds_marker("tool call end")
    return f"{begin}function{sep}{name}\n```json\n{args}\n```{end}"


AFTER_CALLS = "vLLM drops text after the first call; we keep non-blank text after calls as content"
NAME_CHECK = "vLLM does not check names against the request's tools; we return such a call as content"

TOOL_CASES: list[ToolCase] = [
    # hermes
    ToolCase(
        "hermes-one",
        "hermes",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    ToolCase(
        "hermes-parallel",
        "hermes",
        'Let me check.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
        '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
        "Let me check.\n",
        [("a", {"x": 1}), ("b", {})],
    ),
    ToolCase(
        "hermes-text-after",
        "hermes",
        'Hi <tool_call>{"name": "a", "arguments": {}}</tool_call> Done.',
        "Hi  Done.",
        [("a", {})],
        differs=AFTER_CALLS,
    ),
    ToolCase(
        "hermes-nested",
        "hermes",
        f'<tool_call>{{"name": "f", "arguments": {ARGS_JSON}}}</tool_call>',
        None,
        [("f", ARGS)],
    ),
    ToolCase(
        "hermes-malformed",
        "hermes",
        '<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {"a": }}</tool_call>',
    ),
    ToolCase("hermes-no-call", "hermes", "Just text, <b>bold</b>.", "Just text, <b>bold</b>."),
    ToolCase(
        "hermes-unknown-name",
        "hermes",
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "rm", "arguments": {}}</tool_call>',
        tools=["ls"],
        differs=NAME_CHECK,
    ),
    # llama3_json
    ToolCase(
        "llama3-one",
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    ToolCase(
        "llama3-tag",
        "llama3_json",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    ToolCase(
        "llama3-parallel",
        "llama3_json",
        '{"name": "a", "parameters": {"x": 1}}; {"name": "b", "parameters": {}}',
        None,
        [("a", {"x": 1}), ("b", {})],
    ),
    ToolCase("llama3-nested", "llama3_json", f'{{"name": "f", "parameters": {ARGS_JSON}}}', None, [("f", ARGS)]),
    ToolCase(
        "llama3-malformed",
        "llama3_json",
        '{"name": "f", "parameters": {"a": }}',
        '{"name": "f", "parameters": {"a": }}',
    ),
    ToolCase("llama3-plain", "llama3_json", "The capital is Paris.", "The capital is Paris."),
    ToolCase(
        "llama3-json-in-text",
        "llama3_json",
        'The call would be {"name": "f", "parameters": {}}',
        'The call would be {"name": "f", "parameters": {}}',
        differs="vLLM takes a JSON object anywhere in the text as a call; we only where the answer begins"
        " or after <|python_tag|>, as Llama's templates prompt for",
    ),
    # mistral
    ToolCase(
        "mistral-one",
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}',
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    ToolCase(
        "mistral-parallel",
        "mistral",
        'Sure.[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}',
        "Sure.",
        [("a", {"x": 1}), ("b", {})],
    ),
    ToolCase("mistral-nested", "mistral", f"[TOOL_CALLS]f[ARGS]{ARGS_JSON}", None, [("f", ARGS)]),
    ToolCase(
        "mistral-list",
        "mistral",
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}]',
        None,
        [("a", {"x": 1}), ("b", {})],
        differs="the pre-v11 list form: vLLM parses it only with a Mistral tokenizer of that version;"
        " we accept both forms whatever the tokenizer",
    ),
    ToolCase(
        "mistral-malformed",
        "mistral",
        '[TOOL_CALLS]f[ARGS]{"a": tru}',
        '[TOOL_CALLS]f[ARGS]{"a": tru}',
        differs="vLLM passes arguments that are not JSON through as a call; we return them as content",
    ),
    # pythonic
    ToolCase("pythonic-one", "pythonic", '[get_weather(city="Paris")]', None, [("get_weather", {"city": "Paris"})]),
    ToolCase(
        "pythonic-parallel",
        "pythonic",
        "[a(x=1), b(s='x', t=[1.5, None, True])]",
        None,
        [("a", {"x": 1}), ("b", {"s": "x", "t": [1.5, None, True]})],
    ),
    ToolCase("pythonic-nested", "pythonic", f"[f({ARGS_PY})]", None, [("f", ARGS)]),
    ToolCase("pythonic-malformed", "pythonic", "[f(a=)]", "[f(a=)]"),
    ToolCase("pythonic-plain", "pythonic", "No call here.", "No call here."),
    # deepseek_v3
    ToolCase(
        "deepseek-one",
        "deepseek_v3",
        DS_CALLS_BEGIN + ds_call("get_weather", '{"city": "Paris"}') + DS_CALLS_END,
        None,
        [("get_weather", {"city": "Paris"})],
    ),
    ToolCase(
        "deepseek-parallel",
        "deepseek_v3",
        "Checking." + DS_CALLS_BEGIN + ds_call("a", '{"x": 1}') + "\n" + ds_call("b", "{}") + DS_CALLS_END,
        "Checking.",
        [("a", {"x": 1}), ("b", {})],
    ),
    ToolCase(
        "deepseek-nested", "deepseek_v3", DS_CALLS_BEGIN + ds_call("f", ARGS_JSON) + DS_CALLS_END, None, [("f", ARGS)]
    ),
]

REASONING_CASES: list[ReasoningCase] = [
    ReasoningCase(
        "r1-block", "deepseek_r1", "<think>\nHmm, 2+2.\n</think>\n\nIt is 4.", "\nHmm, 2+2.\n", "\n\nIt is 4."
    ),
    ReasoningCase(
        "r1-opened-by-template", "deepseek_r1", "Let me think… 東京 🦀</think>Answer", "Let me think… 東京 🦀", "Answer"
    ),
    ReasoningCase("r1-cut-while-thinking", "deepseek_r1", "<think>still going", "still going", None),
    ReasoningCase("r1-nothing-after", "deepseek_r1", "<think>x</think>", "x", None),
    ReasoningCase("qwen3-block", "qwen3", "<think>\nplan\n</think>\n\nDone.", "\nplan\n", "\n\nDone."),
    ReasoningCase("qwen3-thinking-off", "qwen3", "Plain answer.", None, "Plain answer.", enable_thinking=False),
    ReasoningCase("qwen3-no-tags", "qwen3", "Cut before the block ended", "Cut before the block ended", None),
    ReasoningCase("qwen3-empty-block", "qwen3", "<think>\n\n</think>\n\nHi", "\n\n", "\n\nHi"),
]

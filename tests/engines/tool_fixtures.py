"""What the tier's tool tests share: a tool-capable chat template for the tiny model,
written as real templates are (``tools`` rendered with ``tojson``, calls and results as
tags), and tools whose arguments are finite (enums and a boolean), so that even a
random-weight model closes their JSON under a constraint.
"""

from __future__ import annotations

#: Hermes-style: the tools as JSON lines in the system turn, calls and results as tags.
TOOL_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|system|>\nYou may call these functions:\n<tools>\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n</s>\n{% endif %}"
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}<|tool|>\n<tool_response>{{ m.content }}</tool_response></s>\n"
    "{% elif m.tool_calls %}<|assistant|>\n{% for c in m.tool_calls %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}</s>\n"
    "{% else %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

#: Finite arguments (enums and a boolean), so even gibberish closes the JSON.
FORECAST = {
    "type": "function",
    "function": {
        "name": "forecast",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "metric": {"type": "boolean"}},
            "required": ["city", "metric"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "clock", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"], "additionalProperties": False}}}
TOOLS = [FORECAST, CLOCK]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}

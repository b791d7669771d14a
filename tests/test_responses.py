"""`/v1/responses` (docs/responses.md) through the official `openai` client: whole and
streamed responses, the stream helper, `max_output_tokens`, the store (retrieve, delete,
`previous_response_id`, input items), background responses and cancel, function tools
and the tool loop, bad input; and the discovery store shared by two frontends on
etcd + NATS.

The local frontend runs `echo_core` with the byte-level card: it echoes the templated
prompt (`<|system|>\\n…\\n<|user|>\\n…\\n<|assistant|>\\n`), so an answer shows exactly
which conversation the frontend built. It is registered with the `hermes` tool-call
parser: an input that holds `<tool_call>…</tool_call>` markup is echoed back, and the
markup comes out as a call (output is parsed only when the request offers tools)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers import WorkerPool
from llm_helpers import HTTP_TIMEOUT, Frontend, http_request, launch_frontend, local_env, start_frontend, start_mocker

pytestmark = pytest.mark.timeout(150)

MODEL = "bytes"
#: Bound on a background response reaching a state.
BACKGROUND_TIMEOUT = 30.0


@pytest.fixture(scope="module")
def frontend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Frontend]:
    """`in=http out=echo_core` serving `bytes`, one token per byte every millisecond,
    with the `hermes` tool-call parser."""
    pool = WorkerPool(local_env(DYN_TOKEN_ECHO_DELAY_MS="1"), tmp_path_factory.mktemp("responses-logs"))
    try:
        frontend = launch_frontend(pool, "echo_core", "--model-name", MODEL, "--tool-call-parser", "hermes")
        frontend.wait_live_blocking()
        yield frontend
    finally:
        pool.stop_all()


def client(frontend: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=HTTP_TIMEOUT)


def prompt(*turns: tuple[str, str]) -> str:
    """The echo of a conversation: the fallback template of `turns` (role, content)."""
    return "".join(f"<|{role}|>\n{content}\n" for role, content in turns) + "<|assistant|>\n"


def wait_status(c: openai.OpenAI, response_id: str, statuses: set[str]) -> Any:
    """Poll `GET /v1/responses/{id}` until its status is one of `statuses`."""
    deadline = time.monotonic() + BACKGROUND_TIMEOUT
    while True:
        response = c.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        if time.monotonic() > deadline:
            pytest.fail(f"response {response_id} stayed {response.status}, expected one of {statuses}")
        time.sleep(0.05)


# --------------------------------------------------------------------------- create


def test_text_input_with_instructions(frontend: Frontend) -> None:
    response = client(frontend).responses.create(
        model=MODEL, input="hello dynamo", instructions="be brief", temperature=0.5, top_p=0.9,
    )
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status == "completed"
    assert response.model == MODEL
    assert response.created_at > 0
    assert response.output_text == prompt(("system", "be brief"), ("user", "hello dynamo"))
    assert [item.type for item in response.output] == ["message"]
    message = response.output[0]
    assert message.role == "assistant" and message.status == "completed"
    assert message.content[0].type == "output_text"
    assert response.usage is not None
    assert response.usage.output_tokens == len(response.output_text)
    assert response.usage.input_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    assert response.temperature == 0.5 and response.top_p == 0.9


def test_message_list_input(frontend: Frontend) -> None:
    response = client(frontend).responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "part one, "},
                                         {"type": "input_text", "text": "part two"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
            {"role": "user", "content": "again"},
        ],
    )
    assert response.output_text == prompt(
        ("system", "rules"), ("user", "part one, part two"), ("assistant", "ok"), ("user", "again")
    )


def test_max_output_tokens_makes_it_incomplete(frontend: Frontend) -> None:
    response = client(frontend).responses.create(model=MODEL, input="a long enough input", max_output_tokens=12)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None and response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == prompt(("user", "a long enough input"))[:12]
    assert response.output[0].status == "incomplete"
    assert response.usage is not None and response.usage.output_tokens == 12


# --------------------------------------------------------------------------- streaming

EXPECTED_SEQUENCE_HEAD = [
    "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
]
EXPECTED_SEQUENCE_TAIL = [
    "response.output_text.done", "response.content_part.done", "response.output_item.done",
]


def test_stream_has_the_official_event_sequence(frontend: Frontend) -> None:
    stream = client(frontend).responses.create(model=MODEL, input="stream me", stream=True)
    events = list(stream)
    types = [e.type for e in events]
    assert types[:4] == EXPECTED_SEQUENCE_HEAD
    assert types[-4:] == [*EXPECTED_SEQUENCE_TAIL, "response.completed"]
    assert set(types[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == prompt(("user", "stream me"))
    assert events[-4].text == text
    final = events[-1].response
    assert final.status == "completed" and final.output_text == text
    assert final.usage is not None and final.usage.output_tokens == len(text)
    item_ids = {e.item_id for e in events if hasattr(e, "item_id")}
    assert item_ids == {final.output[0].id}


def test_stream_framing_names_each_event(frontend: Frontend) -> None:
    body = json.dumps({"model": MODEL, "input": "x", "stream": True}).encode()
    raw = http_request(frontend.port, "POST", "/v1/responses", body, {"Content-Type": "application/json"})
    assert raw.status == 200 and raw.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in raw.body.decode().split("\n\n") if b.strip()]
    for block in blocks:
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), block
        assert json.loads(lines[1][len("data: "):])["type"] == lines[0][len("event: "):]
    assert "[DONE]" not in raw.body.decode()


def test_stream_helper(frontend: Frontend) -> None:
    with client(frontend).responses.stream(model=MODEL, input="helper", instructions="sys") as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(deltas) == prompt(("system", "sys"), ("user", "helper"))
    assert final.status == "completed"


def test_stream_cut_by_max_output_tokens(frontend: Frontend) -> None:
    events = list(client(frontend).responses.create(model=MODEL, input="xyz", max_output_tokens=4, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert events[-1].response.output_text == prompt(("user", "xyz"))[:4]


# --------------------------------------------------------------------------- store


def test_retrieve_delete_and_previous_response(frontend: Frontend) -> None:
    c = client(frontend)
    first = c.responses.create(model=MODEL, input="first", instructions="not carried over")
    assert c.responses.retrieve(first.id).model_dump() == first.model_dump()
    second = c.responses.create(model=MODEL, input="second", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.output_text == prompt(("user", "first"), ("assistant", first.output_text), ("user", "second"))
    # The chain continues through the stored conversation of `second`.
    third = c.responses.create(model=MODEL, input="third", previous_response_id=second.id, max_output_tokens=1000)
    assert third.output_text == prompt(
        ("user", "first"), ("assistant", first.output_text), ("user", "second"), ("assistant", second.output_text),
        ("user", "third"),
    )

    c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        c.responses.delete(first.id)
    with pytest.raises(openai.NotFoundError) as e:
        c.responses.create(model=MODEL, input="x", previous_response_id=first.id)
    assert e.value.body["param"] == "previous_response_id"

    unstored = c.responses.create(model=MODEL, input="forget me", store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(unstored.id)


def test_streamed_response_is_stored(frontend: Frontend) -> None:
    c = client(frontend)
    events = list(c.responses.create(model=MODEL, input="kept", stream=True))
    final = events[-1].response
    assert c.responses.retrieve(final.id).output_text == final.output_text


# --------------------------------------------------------------------------- background


def test_background_runs_without_a_client_and_cancels(frontend: Frontend) -> None:
    c = client(frontend)
    done = c.responses.create(model=MODEL, input="quick", background=True)
    assert done.background is True and done.status == "queued"
    done = wait_status(c, done.id, {"completed"})
    assert done.output_text == prompt(("user", "quick"))
    with pytest.raises(openai.BadRequestError):
        c.responses.cancel(c.responses.create(model=MODEL, input="not background").id)
    assert c.responses.cancel(done.id).status == "completed", "an ended response is returned as it is"

    # 1 ms per byte: several seconds of output, observed while it grows, then cancelled.
    slow = c.responses.create(model=MODEL, input="y" * 6000, background=True, max_output_tokens=6100)
    progress = wait_status(c, slow.id, {"in_progress"})
    deadline = time.monotonic() + BACKGROUND_TIMEOUT
    while not progress.output or not progress.output_text:
        assert time.monotonic() < deadline, "no partial output was saved"
        time.sleep(0.05)
        progress = c.responses.retrieve(slow.id)
    assert progress.status == "in_progress"
    cancelled = c.responses.cancel(slow.id)
    assert cancelled.status == "cancelled"
    assert c.responses.retrieve(slow.id).status == "cancelled"
    assert len(cancelled.output_text) < 6100


def test_background_stream_and_replay_after_a_sequence_number(frontend: Frontend) -> None:
    c = client(frontend)
    stream = c.responses.create(model=MODEL, input="replayed", background=True, stream=True)
    events = list(stream)
    assert [e.type for e in events[:2]] == ["response.created", "response.queued"]
    assert events[-1].type == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    response_id = events[0].response.id
    # A reader that saw the first 5 events resumes after sequence number 4.
    replayed = list(c.responses.retrieve(response_id, stream=True, starting_after=4))
    assert [e.model_dump() for e in replayed] == [e.model_dump() for e in events[5:]]
    assert c.responses.retrieve(response_id).output_text == prompt(("user", "replayed"))
    with pytest.raises(openai.NotFoundError):
        list(c.responses.retrieve(c.responses.create(model=MODEL, input="x").id, stream=True))


# --------------------------------------------------------------------------- function tools

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                          "additionalProperties": False}}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Bern"}}</tool_call>'
QUESTION = f"weather?{CALL}"
#: The echo of QUESTION, split by the parser: the text before the call, the text after
#: (the chat output stage trims the whitespace that ends an answer with calls).
BEFORE, AFTER = "<|user|>\nweather?", "\n<|assistant|>"


def assert_call(item: Any) -> None:
    assert item.type == "function_call" and item.status == "completed"
    assert item.id.startswith("fc_") and item.call_id.startswith("call_")
    assert item.name == "get_weather" and json.loads(item.arguments) == {"city": "Bern"}


def test_function_tools_give_function_call_items(frontend: Frontend) -> None:
    response = client(frontend).responses.create(model=MODEL, input=QUESTION, tools=[WEATHER])  # type: ignore[list-item]
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["message", "function_call", "message"]
    assert response.output_text == BEFORE + AFTER
    assert_call(response.output[1])
    assert response.tools[0].name == "get_weather"  # type: ignore[union-attr]
    assert response.tool_choice == "auto" and response.parallel_tool_calls is True
    # Without tools the markup is text, as the model wrote it.
    plain = client(frontend).responses.create(model=MODEL, input=QUESTION)
    assert plain.output_text == prompt(("user", QUESTION)) and len(plain.output) == 1
    none = client(frontend).responses.create(model=MODEL, input=QUESTION, tools=[WEATHER],  # type: ignore[list-item]
                                             tool_choice="none")
    assert none.output_text == prompt(("user", QUESTION)) and none.tool_choice == "none"


def test_a_streamed_call_has_the_official_events(frontend: Frontend) -> None:
    events = list(client(frontend).responses.create(model=MODEL, input=QUESTION, tools=[WEATHER],  # type: ignore[list-item]
                                                    stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    start = types.index("response.function_call_arguments.delta") - 1
    assert types[start - 1:start + 4] == [
        "response.output_item.done", "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    ]
    added, delta, done, item_done = events[start:start + 4]
    assert added.item.type == "function_call" and added.item.status == "in_progress" and added.item.arguments == ""
    assert delta.item_id == done.item_id == added.item.id == item_done.item.id
    assert delta.output_index == done.output_index == 1
    assert json.loads(done.arguments) == {"city": "Bern"}
    assert_call(item_done.item)
    final = events[-1].response
    assert events[-1].type == "response.completed"
    assert final.output[1].model_dump() == item_done.item.model_dump()
    assert final.output_text == BEFORE + AFTER


def test_the_openai_client_runs_a_two_turn_tool_loop(frontend: Frontend) -> None:
    c = client(frontend)
    first = c.responses.create(model=MODEL, input=QUESTION, tools=[WEATHER])  # type: ignore[list-item]
    call = first.output[1]
    result = {"type": "function_call_output", "call_id": call.call_id, "output": "18 degrees"}  # type: ignore[union-attr]
    # The history the template gets: the question, the assistant turn (its text and
    # call are one message; this template writes the text only), the tool's result.
    expected = prompt(("user", QUESTION), ("assistant", BEFORE), ("assistant", AFTER), ("tool", "18 degrees"))
    # Turn two through the store ...
    second = c.responses.create(model=MODEL, input=[result], previous_response_id=first.id,  # type: ignore[list-item]
                                tools=[WEATHER], tool_choice="none")  # type: ignore[list-item]
    assert second.output_text == expected
    # ... and with the whole history sent back, the way the client's docs loop does it.
    history: list[Any] = [{"role": "user", "content": QUESTION}, *first.output, result]
    again = c.responses.create(model=MODEL, input=history, tools=[WEATHER], tool_choice="none")  # type: ignore[list-item]
    assert again.output_text == expected
    items = c.responses.input_items.list(again.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "function_call", "message", "function_call_output"]


def test_input_items_are_listed_in_pages(frontend: Frontend) -> None:
    c = client(frontend)
    turns = [{"role": "user", "content": f"turn {i}"} for i in range(5)]
    response = c.responses.create(model=MODEL, input=turns)  # type: ignore[arg-type]
    newest_first = c.responses.input_items.list(response.id)
    assert [i.content[0].text for i in newest_first.data] == [f"turn {i}" for i in range(4, -1, -1)]  # type: ignore[union-attr]
    assert newest_first.has_more is False
    assert newest_first.first_id == newest_first.data[0].id and newest_first.last_id == newest_first.data[-1].id
    page = c.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.content[0].text for i in page.data] == ["turn 0", "turn 1"]  # type: ignore[union-attr]
    assert page.has_more is True
    rest = c.responses.input_items.list(response.id, order="asc", limit=2, after=page.last_id)  # type: ignore[arg-type]
    assert [i.content[0].text for i in rest.data] == ["turn 2", "turn 3"]  # type: ignore[union-attr]
    # The client's auto-pagination follows has_more and last_id.
    every = c.responses.input_items.list(response.id, order="asc", limit=2)
    assert [i.content[0].text for i in every] == [f"turn {i}" for i in range(5)]  # type: ignore[union-attr]
    text = c.responses.input_items.list(c.responses.create(model=MODEL, input="plain").id)
    assert text.data[0].type == "message" and text.data[0].role == "user"  # type: ignore[union-attr]
    assert text.data[0].content[0].type == "input_text"  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):
        c.responses.input_items.list("resp_unknown")
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.input_items.list(response.id, limit=101)
    assert e.value.body["param"] == "limit"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": [{"type": "function", "description": "no name"}]}, "tools[0].name"),
        ({"tools": [{"type": "function", "name": "f", "parameters": "object"}]}, "tools[0].parameters"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "other"}}, "tool_choice.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
         "input[0].content[0].type"),
    ],
)
def test_bad_tools_and_items_are_a_400_naming_the_field(frontend: Frontend, fields: dict[str, Any], param: str) -> None:
    body = json.dumps({"model": MODEL, "input": "hi", **fields}).encode()
    raw = http_request(frontend.port, "POST", "/v1/responses", body, {"Content-Type": "application/json"})
    assert raw.status == 400, raw.body
    assert raw.json()["error"]["param"] == param, raw.body


# --------------------------------------------------------------------------- bad input


def test_bad_input_is_a_clear_4xx(frontend: Frontend) -> None:
    c = client(frontend)
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model="no-such-model", input="x")
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve("resp_unknown")
    image = [{"role": "user", "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}]}]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input=image)
    assert e.value.body["param"] == "input[0].content[0].type"
    assert "text input only" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="x", temperature=7)
    assert "temperature" in e.value.body["message"]
    for body in (b"{not json", b'{"model": "bytes"}', b'{"model": "bytes", "input": 5}'):
        raw = http_request(frontend.port, "POST", "/v1/responses", body, {"Content-Type": "application/json"})
        assert raw.status == 400, (body, raw.body)
        assert raw.json()["error"]["type"] == "invalid_request_error"


# --------------------------------------------------------------------------- fleet


def test_frontend_flags_reach_dynamo_run() -> None:
    from dynamo.frontend.__main__ import dynamo_run_argv, parse_args

    argv = dynamo_run_argv(parse_args(["--responses-store", "discovery", "--responses-ttl-s", "60",
                                       "--responses-max", "5"]))
    assert argv[argv.index("--responses-store") + 1] == "discovery"
    assert argv[argv.index("--responses-ttl-s") + 1] == "60.0"
    assert argv[argv.index("--responses-max") + 1] == "5"
    assert "--responses-store" not in dynamo_run_argv(parse_args([])), "default: dynamo-run's (memory)"
    with pytest.raises(SystemExit):
        parse_args(["--responses-store", "disk"])


@pytest.mark.parametrize("backend", ["etcd_nats"], indirect=True)
async def test_discovery_store_is_shared_by_frontends(
    backend: Any, workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    start_mocker(workers, f"{namespace}.mocker.generate", model_dir)
    flags = ("--responses-store", "discovery")
    one = await start_frontend(workers, "dyn", *flags)
    other = await start_frontend(workers, "dyn", *flags)
    for frontend in (one, other):
        await frontend.wait_models([model_dir.name])
    a, b = client(one), client(other)
    try:
        first = a.responses.create(model=model_dir.name, input="w1 w2", max_output_tokens=8)
        assert first.status == "incomplete" and first.usage.output_tokens == 8
        assert b.responses.retrieve(first.id).model_dump() == first.model_dump()
        second = b.responses.create(model=model_dir.name, input="w3", previous_response_id=first.id,
                                    max_output_tokens=4)
        alone = b.responses.create(model=model_dir.name, input="w3", max_output_tokens=4)
        # The other frontend prepended the stored turn: the prompt grew by it.
        assert second.usage.input_tokens > alone.usage.input_tokens
        assert second.status == "incomplete" and second.previous_response_id == first.id
        background = a.responses.create(model=model_dir.name, input="w4", background=True, max_output_tokens=6)
        assert wait_status(b, background.id, {"incomplete"}).usage.output_tokens == 6
        # The other frontend forwards a replay of the events to the one generating them.
        events = list(a.responses.retrieve(background.id, stream=True))
        assert events[-1].type == "response.incomplete"
        replayed = list(b.responses.retrieve(background.id, stream=True, starting_after=2))
        assert [e.model_dump() for e in replayed] == [e.model_dump() for e in events[3:]]
        # ... and a cancel: a long response started on one is cancelled on the other.
        long = a.responses.create(model=model_dir.name, input="w5", background=True, max_output_tokens=3000)
        wait_status(b, long.id, {"in_progress"})
        cancelled = b.responses.cancel(long.id)
        assert cancelled.status == "cancelled"
        assert a.responses.retrieve(long.id).status == "cancelled"
        assert cancelled.usage is not None and cancelled.usage.output_tokens < 3000
        b.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            a.responses.retrieve(first.id)
        # A frontend that stops saves its unfinished background responses as failed.
        orphan = a.responses.create(model=model_dir.name, input="w6", background=True, max_output_tokens=3000)
        wait_status(b, orphan.id, {"in_progress"})
        a.close()  # its idle keep-alive connection would hold up the frontend's drain
        one.process.terminate(grace=15.0)
        failed = wait_status(b, orphan.id, {"failed"})
        assert failed.error is not None and "shut down" in failed.error.message
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize("backend", ["etcd_nats"], indirect=True)
async def test_discovery_store_keeps_at_most_responses_max(
    backend: Any, workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    start_mocker(workers, f"{namespace}.mocker.generate", model_dir)
    frontend = await start_frontend(workers, "dyn", "--responses-store", "discovery", "--responses-max", "3")
    await frontend.wait_models([model_dir.name])
    c = client(frontend)
    try:
        ids = []
        for i in range(5):
            # A new creation second each, and past the store's once-a-second check.
            ids.append(c.responses.create(model=model_dir.name, input=f"w{i}", max_output_tokens=2).id)
            time.sleep(1.1)
        # The fourth and the fifth write each found one too many and evicted the oldest.
        for gone in ids[:2]:
            with pytest.raises(openai.NotFoundError):
                c.responses.retrieve(gone)
        assert [c.responses.retrieve(kept).id for kept in ids[2:]] == ids[2:]
    finally:
        c.close()

"""`/v1/responses` (docs/responses.md) through the official `openai` client: whole and
streamed responses, the stream helper, `max_output_tokens`, the store (retrieve, delete,
`previous_response_id`), background responses and cancel, bad input; and the discovery
store shared by two frontends on etcd + NATS.

The local frontend runs `echo_core` with the byte-level card: it echoes the templated
prompt (`<|system|>\\n…\\n<|user|>\\n…\\n<|assistant|>\\n`), so an answer shows exactly
which conversation the frontend built."""

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
    """`in=http out=echo_core` serving `bytes`, one token per byte every millisecond."""
    pool = WorkerPool(local_env(DYN_TOKEN_ECHO_DELAY_MS="1"), tmp_path_factory.mktemp("responses-logs"))
    try:
        frontend = launch_frontend(pool, "echo_core", "--model-name", MODEL)
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
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}]
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL, input="x", tools=tools)
    assert e.value.body["param"] == "tools"
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

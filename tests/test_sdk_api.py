"""`@api` routes under `dynamo serve`, for real: a handler's exception is a 500 with its
message (before a stream's first item too), `HTTPException` keeps its status, a returned
Starlette `Response` is sent as it is (streaming, media type, status code, headers), a
generator streams, pydantic values are JSON, an error mid-stream truncates the response."""

from __future__ import annotations

import http.client
import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import READY_TIMEOUT, WorkerPool, WorkerProcess, free_port, wait_until_blocking
from llm_helpers import local_env

GRAPHS = Path(__file__).parent / "sdk_graphs"
#: Bound on one HTTP request to the service.
HTTP_TIMEOUT = 20


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


def wait_for_line(proc: WorkerProcess, text: str, timeout: float) -> None:
    def printed() -> bool:
        if proc.proc.poll() is not None:
            pytest.fail(f"no '{text}' line\n{proc.describe()}")
        return bool(proc.find_lines(text))

    wait_until_blocking(printed, timeout, lambda: f"a '{text}' line\n{proc.describe()}")


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`dynamo serve api_responses:Api` on a free port, file discovery in a fresh directory."""
    root = tmp_path_factory.mktemp("api")
    (root / "kv").mkdir()
    (root / "logs").mkdir()
    env = local_env(DYN_DISCOVERY_BACKEND="file", DYN_FILE_KV=str(root / "kv"), DYN_TCP_HOST="127.0.0.1")
    pool = WorkerPool(env, root / "logs")
    port = free_port()
    argv = [sys.executable, "-m", "dynamo.sdk.cli.main", "serve", "api_responses:Api", f"--Api.port={port}",
            "--Api.host=127.0.0.1"]
    serve = pool.command(argv, name="serve", cwd=GRAPHS)
    try:
        wait_for_line(serve, "Api[0] | Api ready", READY_TIMEOUT)
        yield f"http://127.0.0.1:{port}"
    finally:
        pool.stop_all()


def post(url: str, body: object) -> Reply:
    data = json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT) as response:
            return Reply(response.status, {k.lower(): v for k, v in response.headers.items()}, response.read())
    except urllib.error.HTTPError as error:
        return Reply(error.code, {k.lower(): v for k, v in error.headers.items()}, error.read())


def test_exception_is_a_500_with_its_message(api_url):
    reply = post(f"{api_url}/fail", {"text": "this"})
    assert reply.status == 500, reply
    assert reply.json() == {"detail": "ValueError: cannot handle 'this'"}


def test_exception_before_a_streams_first_item_is_a_500(api_url):
    reply = post(f"{api_url}/fail_stream", {"text": "x"})
    assert reply.status == 500, reply
    assert reply.json() == {"detail": "RuntimeError: no words today"}


def test_http_exception_keeps_its_status(api_url):
    reply = post(f"{api_url}/teapot", {"text": "x"})
    assert (reply.status, reply.json()) == (418, {"detail": "short and stout"}), reply


def test_streaming_response_is_sent_as_is(api_url):
    reply = post(f"{api_url}/stream", {"text": "a b c"})
    assert reply.status == 200, reply
    assert reply.headers["content-type"] == "application/x-ndjson"
    assert reply.headers["x-words"] == "yes"
    assert reply.headers.get("transfer-encoding") == "chunked"
    assert [json.loads(line) for line in reply.body.splitlines()] == [{"word": "a"}, {"word": "b"}, {"word": "c"}]


def test_json_response_keeps_its_status_code(api_url):
    reply = post(f"{api_url}/created", {"text": "thing"})
    assert (reply.status, reply.json()) == (201, {"created": "thing"}), reply


def test_plain_text_response_from_a_sync_handler(api_url):
    reply = post(f"{api_url}/plain", {"text": "shout"})
    assert (reply.status, reply.body) == (202, b"SHOUT"), reply
    assert reply.headers["content-type"].startswith("text/plain")


def test_generators_still_stream(api_url):
    words = post(f"{api_url}/words", {"text": "one two"})
    assert (words.status, words.body) == (200, b"one\ntwo\n"), words
    assert words.headers["content-type"].startswith("text/event-stream")
    counts = post(f"{api_url}/counts", {"text": "a bbb"})
    assert [json.loads(line) for line in counts.body.splitlines()] == [{"words": 1}, {"words": 3}]


def test_pydantic_value_is_json(api_url):
    reply = post(f"{api_url}/count", {"text": "a b c d"})
    assert (reply.status, reply.json()) == (200, {"words": 4}), reply


def test_invalid_body_is_still_a_422(api_url):
    reply = post(f"{api_url}/fail", {"txt": 1})
    assert reply.status == 422 and b"text" in reply.body, reply


def test_error_mid_stream_truncates_the_response(api_url):
    """The status is sent with the first item; a later exception cannot change it, so the
    response ends without its last chunk and the client sees a truncated body, not a
    clean end. The service keeps serving."""
    with pytest.raises(http.client.IncompleteRead) as truncated:
        post(f"{api_url}/fail_midway", {"text": "x"})
    assert truncated.value.partial == b"first\n"
    assert post(f"{api_url}/count", {"text": "still here"}).json() == {"words": 2}

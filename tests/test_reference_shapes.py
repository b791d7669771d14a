"""Scripts in the shape of the reference's simple binding examples (tests/reference_shapes,
written here) run unchanged against this package, on both backends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from llm_helpers import chat_body, start_frontend, streamed_content

SHAPES = Path(__file__).parent / "reference_shapes"
RUN_TIMEOUT = 60.0

pytestmark = pytest.mark.timeout(120)


def script(workers, name: str):
    return workers.command([sys.executable, str(SHAPES / f"{name}.py")], name=name)


async def run_client(workers, name: str) -> list[str]:
    client = script(workers, name)
    status = await client.wait_exit(RUN_TIMEOUT)
    assert status == 0, client.describe()
    return client.stdout().splitlines()


async def test_hello_world(workers) -> None:
    server = script(workers, "hello_world_server")
    await server.wait_for_line("Started server instance", RUN_TIMEOUT)
    lines = await run_client(workers, "hello_world_client")
    # One printed item per character of "hello world".
    assert len(lines) == len("hello world"), lines
    server.send_signal(2)
    assert await server.wait_exit(30) == 0, server.describe()


async def test_typed(workers) -> None:
    server = script(workers, "typed_server")
    await server.wait_for_line("Started server instance", RUN_TIMEOUT)
    lines = await run_client(workers, "typed_client")
    assert lines == ['{"char":"h"}', '{"char":"e"}', '{"char":"y"}'], lines


async def test_error_handling(workers) -> None:
    server = script(workers, "error_server")
    await server.wait_for_line("Started server instance", RUN_TIMEOUT)
    lines = await run_client(workers, "error_client")
    assert lines[:6] == ["h", "e", "l", "l", "o", " "], lines
    assert lines[6].startswith("caught: ") and "w is not allowed" in lines[6], lines
    assert lines[7:] == ["h", "e", "l", "l", "o", "errors: 1"], lines


async def test_register_llm_positional(workers) -> None:
    frontend = await start_frontend(workers, "dyn")
    server = script(workers, "register_llm_server")
    await server.wait_for_line("Started server instance", RUN_TIMEOUT)
    await frontend.wait_models(["reference-model"])
    response = frontend.post("/v1/chat/completions", chat_body("reference-model", "hello", stream=True))
    assert response.status == 200, response.body
    _, chunks = streamed_content(response.body)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"

"""Handlers that misbehave: one that never yields, one that stalls after its first item,
one that raises mid-stream, one that ends without a finish reason. Each ends as an
explicit error within the configured stream bounds — never a hang, never a response that
looks complete."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest
from fleet import Fleet
from llm_helpers import post_json
from load import chat_body, stream_chat

pytestmark = pytest.mark.timeout(90)

BAD_WORKER = Path(__file__).parent / "bad_worker.py"
#: The frontend's stream bounds in this test (seconds).
BOUND = 3.0


@pytest.mark.parametrize(
    ("mode", "status", "message"),
    [
        ("hang", 504, "DYN_STREAM_FIRST_ITEM_TIMEOUT"),
        ("stall", 504, "DYN_STREAM_ITEM_TIMEOUT"),
        ("raise", 500, "crashed mid-stream"),
        ("truncate", 500, "without a finish reason"),
    ],
)
async def test_misbehaving_handler_is_an_explicit_bounded_error(
    fleet: Fleet, mode: str, status: int, message: str, record
) -> None:
    argv = [sys.executable, "-u", str(BAD_WORKER), "--endpoint", fleet.endpoint,
            "--model-path", str(fleet.model_dir), "--mode", mode]
    worker = fleet.pool.command(argv, name=f"bad-{mode}")
    await worker.wait_ready(30)
    bounds = {"DYN_STREAM_FIRST_ITEM_TIMEOUT": str(BOUND), "DYN_STREAM_ITEM_TIMEOUT": str(BOUND)}
    # One stream's bounds, without migration (on by default: a stalled stream would be
    # continued, on this single worker, up to 3 more times, each after its own bound).
    frontend = await fleet.start_frontend("--migration-limit", "0", env=bounds)

    streamed = await stream_chat(frontend.port, chat_body(fleet.model, 1), max_tokens=8)
    assert streamed.kind == "error", streamed
    assert message in streamed.detail, streamed
    assert streamed.elapsed < BOUND + 3, streamed
    if mode == "hang":
        # Nothing was sent yet, so the status itself says what happened.
        assert f"HTTP {status}" in streamed.detail, streamed

    body = {"model": fleet.model, "messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 8}
    start = time.monotonic()
    whole = await asyncio.to_thread(post_json, frontend.port, "/v1/chat/completions", body)
    assert whole.status == status, (whole.status, whole.body[:300])
    assert message in whole.json()["error"]["message"], whole.body[:300]
    assert time.monotonic() - start < BOUND + 3
    assert worker.proc.poll() is None, "the worker survives its handler's misbehaviour"

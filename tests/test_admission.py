"""Admission control in real processes, on both backends: a frontend (`dynamo-run in=http
out=dyn --max-inflight-requests N`) over mocker workers, driven past one model's limit,
answers the excess 429 with `Retry-After` at once while every admitted request completes,
and a second model is served meanwhile (one saturated model does not refuse another)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers import WorkerPool
from llm_helpers import Frontend, Response, chat_body, start_frontend, start_mocker, write_json

pytestmark = pytest.mark.timeout(150)

LIMIT = 3
#: Concurrent requests sent to the saturated model: well past its limit.
BURST = 12


def rejected_count(frontend: Frontend, model: str) -> float:
    """The frontend's count of `model`'s requests refused for requests in flight."""
    text = frontend.get("/metrics").body.decode()
    series = f'dynamo_frontend_admission_rejected_total{{model="{model}",reason="inflight_requests"}}'
    found = re.search(re.escape(series) + r" (\S+)", text)
    return float(found.group(1)) if found else 0.0


async def test_a_model_past_its_limit_gets_429s_and_another_model_is_served(
    workers: WorkerPool, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    # Slow enough that a burst overlaps: 40 decode steps of several milliseconds each.
    slow = write_json(tmp_path / "slow.json", {"speedup_ratio": 1.0})
    fast = write_json(tmp_path / "fast.json", {"speedup_ratio": 20.0})
    start_mocker(workers, f"{namespace}.busy.generate", model_dir, "--model-name", "busy",
                 "--extra-engine-args", str(slow), name="busy")
    start_mocker(workers, f"{namespace}.calm.generate", model_dir, "--model-name", "calm",
                 "--extra-engine-args", str(fast), name="calm")
    frontend = await start_frontend(workers, "dyn", "--max-inflight-requests", str(LIMIT))
    await frontend.wait_models(["busy", "calm"])

    def busy() -> Response:
        return frontend.post("/v1/chat/completions", chat_body("busy", "w5 w6 w7", max_tokens=40))

    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(BURST) as pool:
        burst = [loop.run_in_executor(pool, busy) for _ in range(BURST)]
        # While the burst is in flight, the other model answers.
        calm = await asyncio.to_thread(frontend.post, "/v1/chat/completions", chat_body("calm", "w8", max_tokens=2))
        answers = await asyncio.gather(*burst)

    assert calm.status == 200, calm
    statuses = sorted(a.status for a in answers)
    assert set(statuses) <= {200, 429}, statuses
    refused = [a for a in answers if a.status == 429]
    admitted = [a for a in answers if a.status == 200]
    assert refused, f"{BURST} concurrent requests past a limit of {LIMIT} were all admitted"
    assert len(admitted) >= LIMIT, statuses
    for answer in refused:
        assert answer.headers.get("retry-after") == "1", answer
        assert answer.json()["error"]["code"] == "rate_limit_exceeded", answer
    for answer in admitted:
        assert answer.json()["usage"]["completion_tokens"] == 40, answer
    assert rejected_count(frontend, "busy") == len(refused)
    assert rejected_count(frontend, "calm") == 0
    # Nothing stays counted: once the burst is over the model takes requests again.
    assert busy().status == 200

"""Resumable streams composed with worker faults, in real processes on both backends:
a client drops mid-stream AND the worker serving it is killed, and the stream still
completes; the joined output (before the cut + after the resume) is byte-identical to an
uninterrupted run with the same seed. The frontend runs with its defaults: migration
(limit 3) is on without a flag."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from fleet import Fleet
from resume_client import content, read_all, request, resumable_run

pytestmark = pytest.mark.timeout(150)

#: Slow enough that a second worker starts while the first is still generating.
SLOW = ("--speedup-ratio", "0.05")
MAX_TOKENS = 120


def completion(model: str) -> dict:
    # Words of the test model's vocabulary (w3, w4, …): generated tokens are drawn from them.
    prompt = " ".join(f"w{i}" for i in range(3, 40))
    return {"model": model, "prompt": prompt, "stream": True,
            "max_tokens": MAX_TOKENS, "seed": 1234}


async def test_dropped_client_and_killed_worker_still_complete_byte_identical(fleet: Fleet) -> None:
    first, = await fleet.start_workers(1, *SLOW)
    frontend = await fleet.start_frontend()
    body = completion(fleet.model)
    uninterrupted = content(await read_all(await request(frontend.port, "POST", "/v1/completions", body)))
    assert uninterrupted, "the reference run generated text"

    async def lose_the_worker() -> None:
        # A second worker to migrate to, then the one serving the stream dies.
        await fleet.start_workers(1, *SLOW)
        await asyncio.sleep(2.0)  # the frontend's watch sees the new worker
        first.kill()
        await asyncio.sleep(1.0)

    request_id = f"resume-{uuid.uuid4().hex[:8]}"
    events, _ = await resumable_run(frontend.port, "/v1/completions", body, request_id, cut_after=5,
                                    before_resume=lose_the_worker)
    ids = [e.id for e in events]
    assert ids == list(range(len(ids))), f"events duplicated or missing: {ids}"
    assert events[-1].data == "[DONE]"
    assert content(events) == uninterrupted
    metrics = frontend.get("/metrics").body.decode()
    migrated = sum(float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines()
                   if line.startswith("dynamo_frontend_migrations_total"))
    assert migrated >= 1, "the stream was continued on the second worker"


async def test_resume_on_another_frontend(etcd_fleet: Fleet) -> None:
    """Two frontends on etcd + NATS: the stream started on one is resumed on the other,
    which forwards the resume to the owner (found in discovery)."""
    fleet = etcd_fleet
    await fleet.start_workers(1, *SLOW)
    owner = await fleet.start_frontend()
    other = await fleet.start_frontend()
    body = completion(fleet.model)
    uninterrupted = content(await read_all(await request(owner.port, "POST", "/v1/completions", body)))
    request_id = f"roam-{uuid.uuid4().hex[:8]}"
    events, _ = await resumable_run(owner.port, "/v1/completions", body, request_id, cut_after=3,
                                    resume_port=other.port)
    assert [e.id for e in events] == list(range(len(events)))
    assert content(events) == uninterrupted

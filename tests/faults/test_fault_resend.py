"""One resend policy (docs/reliability.md): with one of three workers frozen (SIGSTOP),
no request fails — a request the frozen worker never started is sent to another
instance, one it was streaming is continued elsewhere — and once a request to it has
failed, new requests avoid it until it answers again; after thawing it is used again.
The same holds for a `chat` model (OpenAI requests, not tokens): a request the frozen
worker never started succeeds on another instance.

Which instance each request went to is read from the frontend's own log (the remote
engine's `sending to instance` debug line), so the test sees the routing decisions
themselves, not a guess from timings."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import datetime
from pathlib import Path

import pytest
from fleet import Fleet, freeze, thaw
from llm_helpers import chat_body, streamed_content
from load import Load

pytestmark = pytest.mark.timeout(60)

#: Seconds a worker has to take a request (NATS plane), short to keep the test quick.
RESPONSE_TIMEOUT = 2
#: Longer than the freeze, so that the frozen worker stays registered: the test is about
#: the frontend avoiding it, not discovery dropping it.
LEASE_TTL = 15
FREEZE = 7.0
#: A request picked just before the first failure may be logged just after it.
PICK_RACE = 1.0
#: Bound on the thawed worker getting a request again (probe interval + peer timeout + slack).
BACK_BOUND = 15.0
CLIENTS = 4

LOG_FILTER = "warn,dynamo_llm::remote::engine=debug"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
INSTANCE = re.compile(r"instance=([0-9a-f]+)")
FAILED = ("worker did not start the request", "worker stream broke", "instance unreachable")


def log_lines(path: Path) -> list[tuple[float, str]]:
    """(UNIX time, line) of each timestamped line of a frontend log."""
    lines = []
    for raw in path.read_text(errors="replace").splitlines():
        line = ANSI.sub("", raw).strip()
        stamp, _, _ = line.partition(" ")
        try:
            when = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        lines.append((when, line))
    return lines


def instance_of(line: str) -> str | None:
    found = INSTANCE.search(line)
    return found.group(1) if found else None


def sends(lines: list[tuple[float, str]], instance: str) -> list[float]:
    return [t for t, line in lines if "sending to instance" in line and instance_of(line) == instance]


async def test_a_frozen_worker_is_avoided_and_no_request_fails(fleet: Fleet) -> None:
    env = {"DYN_LEASE_TTL": str(LEASE_TTL), "DYN_RESPONSE_TIMEOUT": str(RESPONSE_TIMEOUT)}
    workers = [fleet.start_worker(env=env) for _ in range(3)]
    for w in workers:
        await w.wait_for_line("dynamo-run: serving model", 30)
    frontend = await fleet.start_frontend("--migration-limit", "3", env={**env, "DYN_LOG": LOG_FILTER})
    log = frontend.process.stderr_path
    load = Load(frontend.port, fleet.model, clients=CLIENTS)
    load.start()
    try:
        await asyncio.sleep(2)
        frozen = workers[0]
        freeze(frozen)
        await asyncio.sleep(FREEZE)
        while_frozen = log_lines(log)
        thaw(frozen)
        thawed = time.time()

        failures = [(t, line) for t, line in while_frozen if any(f in line for f in FAILED)]
        assert failures, "no request to the frozen worker failed: the test froze nothing"
        first_failure, victim = failures[0][0], instance_of(failures[0][1])
        assert victim is not None, failures[0][1]
        failed_instances = {instance_of(line) for _, line in failures}
        assert failed_instances == {victim}, f"requests failed on instances that were not frozen: {failures[:5]}"
        assert sends(while_frozen, victim), "the frozen worker never got a request"
        late = [t - first_failure for t in sends(while_frozen, victim) if t > first_failure + PICK_RACE]
        assert not late, f"new requests went to the frozen worker {late} s after its first failure"

        deadline = time.monotonic() + BACK_BOUND
        while not [t for t in sends(log_lines(log), victim) if t >= thawed]:
            assert time.monotonic() < deadline, f"the thawed worker got no request within {BACK_BOUND:.0f}s"
            await asyncio.sleep(0.2)
    finally:
        await load.stop()

    bad = [o for o in load.outcomes if o.kind != "ok"]
    assert load.outcomes, "no request was made"
    assert not bad, f"{len(bad)} of {len(load.outcomes)} requests failed: {[o.detail for o in bad[:5]]}"
    assert frozen.proc.poll() is None, frozen.describe()


#: The chat model the echo workers register.
CHAT_MODEL = "echo-chat"
#: Requests sent at once to a chat model right after one of its three workers froze.
CHAT_REQUESTS = 6


async def test_a_chat_request_the_frozen_worker_never_started_succeeds_elsewhere(fleet: Fleet) -> None:
    env = {"DYN_LEASE_TTL": str(LEASE_TTL), "DYN_RESPONSE_TIMEOUT": str(RESPONSE_TIMEOUT)}
    workers = [fleet.start_echo_worker(CHAT_MODEL, env=env) for _ in range(3)]
    for w in workers:
        await w.wait_for_line("dynamo-run: serving model", 30)
    frontend = await fleet.start_frontend(env={**env, "DYN_LOG": LOG_FILTER}, models=[CHAT_MODEL])
    log = frontend.process.stderr_path
    body = chat_body(CHAT_MODEL, "hello there", stream=True, max_tokens=3)

    def ask() -> tuple[int, str]:
        response = frontend.post("/v1/chat/completions", body)
        if response.status != 200:
            return response.status, response.body.decode(errors="replace")
        text, chunks = streamed_content(response.body)
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length"), chunks[-1]
        return response.status, text

    for _ in range(3):  # every instance has answered once: connections are open
        assert ask()[0] == 200
    frozen = workers[0]
    freeze(frozen)
    since = time.time()
    try:
        # At once, before the frontend's pings find the worker silent: round-robin sends
        # some of these to the frozen worker, which never starts them.
        answers = await asyncio.gather(*(asyncio.to_thread(ask) for _ in range(CHAT_REQUESTS)))
        lines = [(t, line) for t, line in log_lines(log) if t >= since]
    finally:
        thaw(frozen)

    assert [status for status, _ in answers] == [200] * CHAT_REQUESTS, answers
    failures = [(t, line) for t, line in lines if any(f in line for f in FAILED)]
    assert failures, "no chat request went to the frozen worker: the test froze nothing"
    victims = {instance_of(line) for _, line in failures}
    assert len(victims) == 1 and None not in victims, f"requests failed on more than one instance: {failures[:5]}"
    victim = victims.pop()
    assert sends(lines, victim), "the frozen worker never got a request"
    others = {instance_of(line) for _, line in lines if "sending to instance" in line} - {victim}
    assert others, "no request was sent to another instance"
    assert frozen.proc.poll() is None, frozen.describe()

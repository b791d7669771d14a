"""One resend policy (docs/reliability.md): with one of three workers frozen (SIGSTOP),
no request fails — a request the frozen worker never started is sent to another
instance, one it was streaming is continued elsewhere — and once a request to it has
failed, new requests avoid it until it answers again; after thawing it is used again.

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

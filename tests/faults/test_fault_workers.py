"""Worker faults under a closed-loop streaming load through the HTTP frontend: a worker
killed (with and without migration), stopped gracefully (scale-down), frozen (SIGSTOP)
and thawed, and a rolling restart of every worker (the local twin of a Kubernetes
rolling update: docs/reliability.md, "Readiness and drain").

Every test asserts: no request hangs, none is silently truncated, at most the stated
number fail (each with an explicit error), and the fleet serves fully afterwards."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest
from fleet import FAST_BOUNDS, Fleet, freeze, is_ready, supervised_ports, thaw
from helpers import LEASE_TTL, wait_until
from load import Load, Outcome, summarize

pytestmark = pytest.mark.timeout(150)

CLIENTS = 8
#: Detection bound of a dead or frozen peer with the suite's settings (interval + timeout).
PEER_BOUND = float(FAST_BOUNDS["DYN_TCP_PEER_TIMEOUT"]) + float(FAST_BOUNDS["DYN_TCP_PING_INTERVAL"])


def assert_clean(outcomes: list[Outcome], what: str) -> None:
    bad = [o for o in outcomes if o.kind in ("hung", "truncated")]
    assert not bad, f"{what}: {len(bad)} requests hung or were truncated: {[o.detail for o in bad[:5]]}"


def assert_all_ok(outcomes: list[Outcome], what: str) -> None:
    assert outcomes, f"{what}: no request was made"
    bad = [o for o in outcomes if o.kind != "ok"]
    assert not bad, f"{what}: {len(bad)} of {len(outcomes)} failed: {[o.detail for o in bad[:5]]}"


def migrations(fleet: Fleet) -> float:
    """`dynamo_frontend_migrations_total`, summed over models."""
    assert fleet.frontend is not None
    text = fleet.frontend.get("/metrics").body.decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("dynamo_frontend_migrations_total"))


async def steady(fleet: Fleet, *frontend_args: str, workers: int = 3, worker_args: tuple[str, ...] = ()) -> Load:
    await fleet.start_workers(workers, *worker_args)
    frontend = await fleet.start_frontend(*frontend_args)
    load = Load(frontend.port, fleet.model, clients=CLIENTS)
    load.start()
    await asyncio.sleep(3)
    assert_all_ok(load.outcomes, "before the fault")
    return load


@pytest.mark.parametrize("migration", [0, 3, None], ids=["no-migration", "migration", "default"])
async def test_kill_one_of_three_workers(fleet: Fleet, migration: int | None, record) -> None:
    """The default (no flag) is migration with a limit of 3."""
    flags = () if migration is None else ("--migration-limit", str(migration))
    load = await steady(fleet, *flags)
    victim = fleet.workers[0]
    fault = time.monotonic()
    victim.kill()
    await asyncio.sleep(LEASE_TTL + 6)
    await load.stop()
    limit = "default, 3" if migration is None else migration
    record(summarize(f"kill -9 1 of 3 workers (migration limit {limit})", fleet.backend, load, fault))

    assert_clean(load.outcomes, "kill -9")
    failed = [o for o in load.outcomes if o.kind == "error"]
    if migration != 0:
        assert not failed, f"with migration every stream completes: {[o.detail for o in failed[:5]]}"
        assert migrations(fleet) >= 1, "the streams on the killed worker were continued elsewhere"
    else:
        # Only streams the dead worker had started producing may fail: at most one per client.
        assert len(failed) <= CLIENTS, [o.detail for o in failed]
    assert_all_ok(load.between(fault + 1.0, time.monotonic()), "after the kill")
    assert all(w.proc.poll() is None for w in fleet.pool.started if w is not victim), "another process exited"


@pytest.mark.timeout(90)
async def test_sigterm_one_worker_loses_nothing(fleet: Fleet, record) -> None:
    """Scale-down: SIGTERM 1 of 3 under load. Its /ready turns 503 at once, it exits 0
    within DYN_SHUTDOWN_TIMEOUT, and no request fails."""
    workers = await fleet.start_probed_workers(3)
    frontend = await fleet.start_frontend()
    load = Load(frontend.port, fleet.model, clients=CLIENTS)
    load.start()
    await asyncio.sleep(3)
    assert_all_ok(load.outcomes, "before the fault")
    assert all(is_ready(port) for _, port in workers)
    victim, victim_port = workers[0]
    fault = time.monotonic()
    victim.send_signal(signal.SIGTERM)
    await wait_until(lambda: not is_ready(victim_port), 1.0, "the victim's /ready to turn 503")
    status = await victim.wait_exit(float(FAST_BOUNDS["DYN_SHUTDOWN_TIMEOUT"]) + 5)
    exited = time.monotonic() - fault
    await asyncio.sleep(3)
    await load.stop()
    record(summarize(f"SIGTERM 1 of 3 workers (scale-down; exit 0 after {exited:.1f} s)", fleet.backend, load, fault))
    assert status == 0, victim.describe()
    assert_all_ok(load.outcomes, "graceful stop")
    assert all(is_ready(port) for _, port in workers[1:]), "the other workers stay ready"


@pytest.mark.timeout(90)
async def test_rolling_restart_keeps_two_of_three_ready(fleet: Fleet, record) -> None:
    """SIGHUP to the supervisor of 3 workers under load: each is stopped (it drains),
    replaced, and the next waits for the replacement's /ready. No request fails, and the
    workers that answer /ready 200 never number fewer than 2."""
    supervisor = await fleet.start_supervised_workers(3)
    old = supervised_ports(supervisor)
    assert len(old) == 3, supervisor.describe()
    await wait_until(lambda: all(is_ready(p) for p in old.values()), 30, "the 3 workers to be ready")
    frontend = await fleet.start_frontend()
    load = Load(frontend.port, fleet.model, clients=CLIENTS)
    load.start()
    await asyncio.sleep(3)
    assert_all_ok(load.outcomes, "before the rolling restart")

    counts: list[int] = []
    done = asyncio.Event()

    async def count_ready() -> None:
        while not done.is_set():
            ports = supervised_ports(supervisor).values()
            counts.append(sum(await asyncio.gather(*(asyncio.to_thread(is_ready, p) for p in ports))))
            await asyncio.sleep(0.05)

    counting = asyncio.create_task(count_ready())
    fault = time.monotonic()
    supervisor.send_signal(signal.SIGHUP)
    try:
        await supervisor.wait_for_line("[mocker] rolling restart done", 75)
    finally:
        done.set()
        await counting
    finished = time.monotonic()
    await asyncio.sleep(2)
    await load.stop()
    record(summarize(f"rolling restart of 3 workers ({finished - fault:.1f} s; /ready 200 on >= {min(counts)} "
                     f"of 3 in {len(counts)} probes)", fleet.backend, load, finished))

    assert_all_ok(load.outcomes, "rolling restart")
    assert counts and min(counts) >= 2, f"ready workers during the restart: min {min(counts)} ({counts})"
    assert any(c == 2 for c in counts), "the probe never saw a worker out: the check could not fail"
    new = supervised_ports(supervisor)
    assert set(new) == set(old) and not set(new.values()) & set(old.values()), (old, new)
    assert all(is_ready(p) for p in new.values())
    assert supervisor.proc.poll() is None, supervisor.describe()
    assert len(supervisor.find_lines("[mocker] rolling restart: ")) >= 9, supervisor.stdout()[-3000:]


async def test_sigstop_worker_is_taken_out_and_comes_back(fleet: Fleet, record) -> None:
    load = await steady(fleet, "--migration-limit", "3")
    frozen = fleet.workers[0]
    fault = time.monotonic()
    freeze(frozen)
    await asyncio.sleep(20)
    thaw(frozen)
    thawed = time.monotonic()
    await asyncio.sleep(3)
    record(summarize("SIGSTOP 1 of 3 workers for 20 s", fleet.backend, load, thawed))

    assert_clean(load.outcomes, "SIGSTOP")
    # Once the frozen peer is detected, it is out of rotation: everything succeeds.
    assert_all_ok(load.between(fault + PEER_BOUND + 1.0, thawed), "while frozen, after detection")
    # Streams caught on the frozen worker were migrated or failed explicitly, within the bound.
    for o in load.between(fault - 2, fault + PEER_BOUND + 1.0):
        assert o.kind == "ok" or o.elapsed < PEER_BOUND + float(FAST_BOUNDS["DYN_STREAM_ITEM_TIMEOUT"]) + 3, o

    # Back in rotation: with the other two gone, the thawed worker serves alone.
    for w in fleet.workers[1:]:
        w.kill()
    await asyncio.sleep(LEASE_TTL + PEER_BOUND + 3)
    start = time.monotonic()
    await asyncio.sleep(4)
    await load.stop()
    assert_all_ok(load.between(start, time.monotonic()), "the thawed worker alone")
    assert frozen.proc.poll() is None, frozen.describe()

"""Faults of what the fleet depends on, under a closed-loop streaming load: etcd killed
and restarted at once, etcd away for 30 s, nats-server killed and restarted, the
frontend killed and restarted. No process may exit because a dependency blinked, and
the fleet must come back by itself."""

from __future__ import annotations

import asyncio
import time

import pytest
from fleet import Fleet
from helpers import LEASE_TTL
from load import Load, summarize
from test_fault_workers import CLIENTS, assert_all_ok, assert_clean

pytestmark = pytest.mark.timeout(180)


async def start_loaded(fleet: Fleet) -> Load:
    await fleet.start_workers(3)
    frontend = await fleet.start_frontend()
    load = Load(frontend.port, fleet.model, clients=CLIENTS)
    load.start()
    await asyncio.sleep(3)
    assert_all_ok(load.outcomes, "before the fault")
    return load


async def new_worker_gets_traffic(fleet: Fleet, load: Load) -> None:
    """A worker started now is discovered and serves: with the old ones gone, every
    request succeeds."""
    old = list(fleet.workers)
    (fresh,) = await fleet.start_workers(1)
    await asyncio.sleep(1.0)
    for w in old:
        w.kill()
    await asyncio.sleep(LEASE_TTL + 3)
    start = time.monotonic()
    await asyncio.sleep(3)
    assert_all_ok(load.between(start, time.monotonic()), "the worker started after recovery, alone")
    assert fresh.proc.poll() is None, fresh.describe()


def assert_nobody_exited(fleet: Fleet) -> None:
    dead = [p for p in fleet.pool.started if p.proc.poll() is not None]
    assert not dead, "a process exited because a dependency blinked:\n" + "\n".join(p.describe() for p in dead)


@pytest.mark.parametrize("downtime", [0.0, 30.0], ids=["restart", "down-30s"])
async def test_etcd_outage(etcd_fleet: Fleet, downtime: float, record) -> None:
    fleet = etcd_fleet
    assert fleet.etcd is not None
    load = await start_loaded(fleet)
    fault = time.monotonic()
    fleet.etcd.kill()
    await asyncio.sleep(downtime)
    during = load.between(fault, time.monotonic())
    fleet.etcd.start()
    back = time.monotonic()
    await asyncio.sleep(LEASE_TTL + 3)
    assert_nobody_exited(fleet)
    record(summarize(f"etcd kill -9, restarted after {downtime:.0f} s", fleet.backend, load, back))
    assert_clean(load.outcomes, "etcd outage")
    if downtime:
        # Routing continues on what was last known while etcd is away.
        assert_all_ok(during, "while etcd was away")
    assert_all_ok(load.between(back + 1.0, time.monotonic()), "after etcd came back")
    await new_worker_gets_traffic(fleet, load)
    await load.stop()
    health = fleet.frontend.get("/health") if fleet.frontend else None
    assert health is not None and health.status == 200, health


async def test_nats_restart(etcd_fleet: Fleet, record) -> None:
    fleet = etcd_fleet
    assert fleet.nats is not None
    load = await start_loaded(fleet)
    assert fleet.frontend is not None
    fault = time.monotonic()
    fleet.nats.kill()
    # Nothing can be served without the request plane, and /health says so.
    unhealthy = await fleet.frontend.wait_status("/health", 503, timeout=3)
    assert "NATS" in unhealthy.json()["message"], unhealthy.body
    await asyncio.sleep(max(0.0, fault + 3 - time.monotonic()))
    during = load.between(fault + 0.5, time.monotonic())
    fleet.nats.start()
    back = time.monotonic()
    await fleet.frontend.wait_status("/health", 200, timeout=8)
    await asyncio.sleep(max(0.0, back + 8 - time.monotonic()))
    await load.stop()
    assert_nobody_exited(fleet)
    report = summarize("nats-server kill -9, restarted after 3 s", fleet.backend, load, back)
    record(report)
    assert_clean(load.outcomes, "NATS outage")
    # Without a request plane, requests fail fast with 503, not after a long wait.
    for o in during:
        assert o.kind == "ok" or (o.elapsed < 3.0 and "503" in o.detail), o
    assert report.recovery is not None and report.recovery < 8, report


async def test_frontend_restart(fleet: Fleet, record) -> None:
    load = await start_loaded(fleet)
    assert fleet.frontend is not None
    port = fleet.frontend.port
    fault = time.monotonic()
    fleet.frontend.process.kill()
    await asyncio.sleep(1)
    await fleet.start_frontend(port=port)
    back = time.monotonic()
    await asyncio.sleep(4)
    await load.stop()
    report = summarize("frontend kill -9, restarted", fleet.backend, load, back)
    record(report)
    assert_clean(load.outcomes, "frontend restart")
    assert all(w.proc.poll() is None for w in fleet.workers), "a worker exited when the frontend died"
    assert_all_ok(load.between(back + 0.5, time.monotonic()), "after the restart")
    assert report.recovery is not None and report.recovery < 5, report
    assert load.between(fault, back), "the load kept running across the restart"

"""A worker cut off from the network while its heartbeat stays fresh (embedded backend:
the heartbeat file lives on the shared directory, which a network partition does not
touch). The worker runs in its own network namespace behind a veth pair; the test takes
the link down and up again. Needs `ip netns` (root / CAP_NET_ADMIN); skipped otherwise."""

from __future__ import annotations

import asyncio
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet import Fleet
from helpers import LEASE_TTL
from llm_helpers import write_model_dir
from load import Load, summarize
from test_fault_workers import CLIENTS, PEER_BOUND, assert_all_ok, assert_clean

pytestmark = pytest.mark.timeout(150)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


class Netns:
    """A network namespace linked to the host by a veth pair (host side `.1`, namespace side `.2`)."""

    def __init__(self) -> None:
        tag = uuid.uuid4().hex[:6]
        self.name = f"dynf{tag}"
        self.host_if, self.ns_if = f"vh{tag}", f"vn{tag}"
        octet = 16 + int(tag[:2], 16) % 200
        self.host_ip, self.ns_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"

    def create(self) -> None:
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        _ip("link", "set", self.ns_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.name, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        _ip("-n", self.name, "link", "set", self.ns_if, "up")
        _ip("-n", self.name, "link", "set", "lo", "up")

    def cut(self) -> None:
        _ip("link", "set", self.host_if, "down")

    def heal(self) -> None:
        _ip("link", "set", self.host_if, "up")

    def delete(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=10)


@pytest.fixture
def netns() -> Iterator[Netns]:
    ns = Netns()
    try:
        ns.create()
    except (OSError, subprocess.SubprocessError) as e:
        ns.delete()
        pytest.skip(f"network namespaces are not available here ({e}); the partition test needs `ip netns` as root")
    try:
        yield ns
    finally:
        ns.delete()


async def test_partitioned_worker_with_fresh_heartbeat_is_taken_out(netns: Netns, tmp_path: Path, record) -> None:
    fleet = Fleet("embedded", tmp_path, write_model_dir(tmp_path / "model"), f"faults_{uuid.uuid4().hex[:10]}")
    try:
        await fleet.start_workers(2)
        cut_off = fleet.start_worker(prefix=("ip", "netns", "exec", netns.name), env={"DYN_TCP_HOST": netns.ns_ip})
        await cut_off.wait_for_line("dynamo-run: serving model", 30)
        frontend = await fleet.start_frontend("--migration-limit", "3")
        load = Load(frontend.port, fleet.model, clients=CLIENTS)
        load.start()
        await asyncio.sleep(3)
        assert_all_ok(load.outcomes, "before the partition")

        fault = time.monotonic()
        netns.cut()
        await asyncio.sleep(15)
        # Its heartbeat file is still fresh: discovery alone would keep routing to it.
        assert cut_off.proc.poll() is None
        netns.heal()
        healed = time.monotonic()
        record(summarize("partition 1 of 3 workers for 15 s (fresh heartbeat)", fleet.backend, load, healed))
        assert_clean(load.outcomes, "partition")
        assert_all_ok(load.between(fault + PEER_BOUND + 1.0, healed), "while cut off, after detection")

        # Healed: it answers again and comes back into rotation.
        for w in fleet.workers[:2]:
            w.kill()
        await asyncio.sleep(LEASE_TTL + PEER_BOUND + 3)
        start = time.monotonic()
        await asyncio.sleep(4)
        await load.stop()
        assert_all_ok(load.between(start, time.monotonic()), "the healed worker alone")
    finally:
        fleet.stop()

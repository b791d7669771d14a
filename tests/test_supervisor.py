"""`dynamo.supervisor`'s rolling restart on its own, with plain child processes that serve
`/ready` on the system port the supervisor gives them: every probed child is replaced
in order, and a replacement that never says ready stops the rolling restart (reported,
within its bound) while the supervisor and the other children keep running."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest
from helpers import WorkerPool, alive, started_pids

pytestmark = pytest.mark.timeout(60)

#: A child: `/ready` on DYN_SYSTEM_PORT answers 200, or 503 while the file named by its
#: argument exists; SIGTERM ends it with status 0.
CHILD = """
import http.server, os, signal, sys
hold = sys.argv[1]
class Ready(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(503 if os.path.exists(hold) else 200)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", int(os.environ["DYN_SYSTEM_PORT"])), Ready)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("serving", flush=True)
server.serve_forever()
"""

#: The supervisor of three such children (and one without a probe), 3 s to be ready.
SUPERVISOR = """
import asyncio, sys
from dynamo.supervisor import ChildSpec, Supervisor
child, hold = sys.argv[1], sys.argv[2]
specs = [ChildSpec(f"c[{i}]", [sys.executable, "-c", child, hold], probe=True) for i in range(3)]
specs.append(ChildSpec("plain", [sys.executable, "-c", "import time; time.sleep(600)"]))
sys.exit(asyncio.run(Supervisor(specs, name="sup", stop_timeout=5, ready_timeout=3).run()))
"""


def start(workers: WorkerPool, hold: Path):
    return workers.command([sys.executable, "-u", "-c", SUPERVISOR, CHILD, str(hold)], name="sup")


async def test_rolling_restart_replaces_every_probed_child_in_order(workers_local: WorkerPool, tmp_path: Path):
    sup = start(workers_local, tmp_path / "hold")
    for i in range(3):
        await sup.wait_for_line(f"c[{i}] | serving", 20)
    before = started_pids(sup, "sup")
    sup.send_signal(signal.SIGHUP)
    await sup.wait_for_line("[sup] rolling restart done", 30)
    steps = [line.split(": ", 1)[1].split(" (")[0] for line in sup.find_lines("[sup] rolling restart: ")]
    assert steps == [s for i in range(3) for s in (f"stopping c[{i}]", f"c[{i}] exited with status 0", f"c[{i}] ready")]
    after = started_pids(sup, "sup")
    assert after["plain"] == before["plain"], "a child without a probe is not replaced"
    assert all(after[f"c[{i}]"] != before[f"c[{i}]"] and not alive(before[f"c[{i}]"]) for i in range(3))
    sup.send_signal(signal.SIGTERM)
    assert await sup.wait_exit(20) == 0, sup.describe()


async def test_a_replacement_that_is_never_ready_stops_the_rolling_restart(workers_local: WorkerPool, tmp_path: Path):
    hold = tmp_path / "hold"
    sup = start(workers_local, hold)
    for i in range(3):
        await sup.wait_for_line(f"c[{i}] | serving", 20)
    hold.touch()  # every child (the replacement too) now answers 503
    sup.send_signal(signal.SIGHUP)
    await sup.wait_for_line("[sup] rolling restart stopped: c[0] did not answer /ready within 3s", 20)
    assert not sup.find_lines("[sup] rolling restart: stopping c[1]"), "it went on to the next child"
    pids = started_pids(sup, "sup")
    assert sup.proc.poll() is None and all(alive(pid) for pid in pids.values()), sup.describe()
    sup.send_signal(signal.SIGTERM)
    assert await sup.wait_exit(20) == 0, sup.describe()

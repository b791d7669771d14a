"""`dynamo.supervisor` on its own, with plain child processes that serve `/ready` on the
system port the supervisor gives them. Rolling restart: every probed child is replaced
in order, and a replacement that never says ready stops the rolling restart (reported,
within its bound) while the supervisor and the other children keep running. One child
at a time: a running supervisor takes one more child (after its start delay, ready once
`/ready` answers) and drains one while the others run (not restarted, no failure; one
that ignores SIGTERM is killed after the bound; one still in its start delay never
starts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import WorkerPool, alive, started_pids, wait_until

pytestmark = pytest.mark.timeout(60)

#: A child that keeps the runtime's system-port contract: binds DYN_SYSTEM_PORT (0: a
#: free port) and writes the port it got to DYN_SYSTEM_PORT_FILE (aside, then renamed);
#: `/ready` answers 200, or 503 while the file named by its argument exists; SIGTERM ends
#: it with status 0.
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
port_file = os.environ["DYN_SYSTEM_PORT_FILE"]
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_address[1]))
os.rename(port_file + ".tmp", port_file)
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
        await sup.wait_for_line(f"[sup] c[{i}] ready", 20)
    before = started_pids(sup, "sup")
    sup.send_signal(signal.SIGHUP)
    await sup.wait_for_line("[sup] rolling restart done", 30)
    steps = [line.split(": ", 1)[1].split(" (")[0] for line in sup.find_lines("[sup] rolling restart: ")]
    assert steps == [s for i in range(3) for s in (f"stopping c[{i}]", f"c[{i}] exited with status 0", f"c[{i}] ready")]
    after = started_pids(sup, "sup")
    assert after["plain"] == before["plain"], "a child without a probe is not replaced"
    # Each process bound a port of its own (DYN_SYSTEM_PORT=0) and the supervisor read it.
    reported = [int(line.rsplit(" ", 1)[1]) for line in sup.find_lines("[sup] c[") if " has system port " in line]
    assert len(reported) == 6 and len(set(reported)) == 6, sup.describe()
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


#: The supervisor of one probed child that never writes DYN_SYSTEM_PORT_FILE, 1 s to be ready.
SILENT = """
import asyncio, sys
from dynamo.supervisor import ChildSpec, Supervisor
spec = ChildSpec("mute", [sys.executable, "-c", "import time; time.sleep(600)"], probe=True)
sys.exit(asyncio.run(Supervisor([spec], name="sup", stop_timeout=5, ready_timeout=1).run()))
"""


async def test_a_child_that_never_reports_its_port_is_reported_and_keeps_running(workers_local: WorkerPool):
    sup = workers_local.command([sys.executable, "-u", "-c", SILENT], name="sup")
    await sup.wait_for_line("[sup] mute did not write its system port (DYN_SYSTEM_PORT_FILE) within 1s", 20)
    pid = started_pids(sup, "sup")["mute"]
    assert sup.proc.poll() is None and alive(pid), sup.describe()
    assert not sup.find_lines("[sup] mute ready") and not sup.find_lines(" has system port "), sup.describe()
    sup.send_signal(signal.SIGTERM)
    assert await sup.wait_exit(20) == 0, sup.describe()


#: A running supervisor of one child (restart: always) driven from inside: add a child
#: with a start delay, wait for it to be ready, stop the first, then one that ignores
#: SIGTERM, then one still in its start delay; print what it saw at each step.
ADD_AND_STOP = """
import asyncio, sys
from dynamo.supervisor import ChildSpec, Supervisor
child, hold = sys.argv[1], sys.argv[2]
stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
def spec(label, delay=0.0):
    return ChildSpec(label, [sys.executable, "-c", child, hold], restart="always", max_restarts=3, probe=True,
                     start_delay=delay)
async def until(check):
    async with asyncio.timeout(20):
        while not check():
            await asyncio.sleep(0.05)
async def main():
    sup = Supervisor([spec("c[0]")], name="sup", stop_timeout=2, ready_timeout=20)
    running = asyncio.create_task(sup.run())
    first = sup.children[0]
    added = sup.add(spec("c[1]", delay=0.5))
    print("STEP added pending", added.proc is None and added.ready_at is None, flush=True)
    await until(lambda: added.ready_at is not None)
    print("STEP added ready", [c.label for c in sup.children], flush=True)
    print("STEP stopped c[0] status", await sup.stop_child(first), [c.label for c in sup.children], flush=True)
    deaf = sup.add(ChildSpec("deaf", [sys.executable, "-c", stubborn]))
    await until(lambda: deaf.proc is not None)
    await asyncio.sleep(1)
    print("STEP stopped deaf status", await sup.stop_child(deaf), flush=True)
    late = sup.add(spec("late", delay=60))
    print("STEP stopped late status", await sup.stop_child(late), late.proc is None, flush=True)
    print("STEP running", not running.done(), [c.label for c in sup.children], flush=True)
    return await running
sys.exit(asyncio.run(main()))
"""


async def test_add_and_stop_one_child_while_the_others_run(workers_local: WorkerPool, tmp_path: Path):
    sup = workers_local.command([sys.executable, "-u", "-c", ADD_AND_STOP, CHILD, str(tmp_path / "hold")], name="sup")
    assert await sup.wait_for_line("STEP added pending", 20) == "STEP added pending True"
    assert await sup.wait_for_line("STEP added ready", 20) == "STEP added ready ['c[0]', 'c[1]']"
    assert await sup.wait_for_line("[sup] c[1] ready", 1)
    # Drained: SIGTERM ends it with status 0; it is neither restarted nor a failure.
    assert await sup.wait_for_line("STEP stopped c[0]", 20) == "STEP stopped c[0] status 0 ['c[1]']"
    # SIGTERM ignored: killed after the 2 s bound.
    assert await sup.wait_for_line("STEP stopped deaf", 20) == f"STEP stopped deaf status {-signal.SIGKILL}"
    assert sup.find_lines("[sup] pid ") and "still running after 2s: killing it" in sup.find_lines("[sup] pid ")[0]
    assert await sup.wait_for_line("STEP stopped late", 20) == "STEP stopped late status None True"
    assert await sup.wait_for_line("STEP running", 20) == "STEP running True ['c[1]']"
    pids = started_pids(sup, "sup")
    assert set(pids) == {"c[0]", "c[1]", "deaf"}, "a child stopped in its start delay never starts"
    assert not alive(pids["c[0]"]) and not alive(pids["deaf"]) and alive(pids["c[1]"])
    assert not sup.find_lines("[sup] restarting") and not sup.find_lines("[sup] c[0] exited")
    sup.send_signal(signal.SIGTERM)
    assert await sup.wait_exit(20) == 0, sup.describe()
    assert not alive(pids["c[1]"])


def test_the_mocker_supervisor_reads_its_ready_bound_from_the_environment(tmp_path: Path, monkeypatch):
    """`python -m dynamo.mocker --num-workers N` honours DYN_SDK_READY_TIMEOUT as `dynamo
    serve` does: a value that is not seconds stops it before any worker starts."""
    from dynamo.supervisor import READY_TIMEOUT_ENV, seconds_from_env

    env = {**os.environ, READY_TIMEOUT_ENV: "soon"}
    done = subprocess.run([sys.executable, "-m", "dynamo.mocker", "--num-workers", "2"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "DYN_SDK_READY_TIMEOUT must be a number of seconds >= 0, got 'soon'" in done.stderr
    assert "started" not in done.stdout
    monkeypatch.setenv(READY_TIMEOUT_ENV, "2.5")
    assert seconds_from_env(READY_TIMEOUT_ENV, 120.0) == 2.5
    monkeypatch.delenv(READY_TIMEOUT_ENV)
    assert seconds_from_env(READY_TIMEOUT_ENV, 120.0) == 120.0


#: A child that starts a grandchild in its process group (as a worker starts its engine's
#: core process) and writes the grandchild's pid to a file. On SIGTERM each notes it in
#: the file; the child then stops the grandchild itself and exits 0. With ``deaf``, both
#: ignore SIGTERM.
FAMILY = """
import os, signal, subprocess, sys, time
log, deaf = sys.argv[1], sys.argv[2] == "deaf"
def note(line):
    with open(log, "a") as f:
        f.write(line + "\\n")
grandchild = subprocess.Popen([sys.executable, "-c", sys.argv[3], log, sys.argv[2]])
note(f"grandchild {grandchild.pid}")
def on_term(*_):
    time.sleep(0.5)  # a SIGTERM sent to the whole group would have reached the grandchild by now
    note("child SIGTERM")
    grandchild.kill()
    grandchild.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if deaf else on_term)
while True:
    time.sleep(1)
"""
GRANDCHILD = """
import signal, sys, time
log, deaf = sys.argv[1], sys.argv[2] == "deaf"
def on_term(*_):
    with open(log, "a") as f:
        f.write("grandchild SIGTERM\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if deaf else on_term)
while True:
    time.sleep(1)
"""
#: A supervisor of one such family that drains, and one that ignores SIGTERM.
FAMILIES = """
import asyncio, sys
from dynamo.supervisor import ChildSpec, Supervisor
family, grandchild, folder = sys.argv[1], sys.argv[2], sys.argv[3]
specs = [ChildSpec(kind, [sys.executable, "-c", family, f"{folder}/{kind}.log", kind, grandchild])
         for kind in ("drains", "deaf")]
sys.exit(asyncio.run(Supervisor(specs, name="sup", stop_timeout=2).run()))
"""


async def test_sigterm_reaches_the_child_alone_and_sigkill_its_whole_group(workers_local: WorkerPool, tmp_path: Path):
    """A worker drains on SIGTERM and then stops its engine: the engine's processes must not
    get SIGTERM from the supervisor too (vLLM's engine core aborts its requests on it). A
    child that ignores SIGTERM is killed after the bound with everything in its group."""
    sup = workers_local.command([sys.executable, "-u", "-c", FAMILIES, FAMILY, GRANDCHILD, str(tmp_path)], name="sup")

    def grandchild(kind: str) -> int | None:
        log = tmp_path / f"{kind}.log"
        lines = log.read_text().splitlines() if log.exists() else []
        found = [line for line in lines if line.startswith("grandchild ")]
        return int(found[0].split()[1]) if found else None

    await wait_until(lambda: grandchild("drains") is not None and grandchild("deaf") is not None, 20, sup.describe)
    deaf = grandchild("deaf")
    assert deaf is not None
    sup.send_signal(signal.SIGTERM)
    assert await sup.wait_exit(20) == 0, sup.describe()
    lines = (tmp_path / "drains.log").read_text().splitlines()
    assert lines[1:] == ["child SIGTERM"], lines  # the grandchild never got a SIGTERM
    assert sup.find_lines("[sup] processes still running after 2s: killing them"), sup.describe()
    await wait_until(lambda: not alive(deaf), 10, "the deaf child's grandchild to be killed with its group")


def test_a_child_is_killed_only_after_its_own_drain_bound_and_a_margin(monkeypatch) -> None:
    """SIGKILL after SIGTERM comes `KILL_MARGIN_SECONDS` after the child's drain bound (its
    `DYN_SHUTDOWN_TIMEOUT`, from its spec or this process's environment): at its bound a
    worker ends the streams still running as unavailable, for migration, and exits by
    itself. Before, `dynamo serve` and the planner's local connector killed at 30 s, the
    runtime's default bound itself. An explicit stop timeout still wins."""
    from dynamo._core import drain_bound_s
    from dynamo.sdk.deploy.lifecycle import grace_period
    from dynamo.supervisor import DEFAULT_SHUTDOWN_TIMEOUT, ChildSpec, Supervisor, stop_bound

    monkeypatch.delenv("DYN_SHUTDOWN_TIMEOUT", raising=False)
    assert drain_bound_s({}) == DEFAULT_SHUTDOWN_TIMEOUT  # the runtime's own default
    assert stop_bound({}) == grace_period(0, DEFAULT_SHUTDOWN_TIMEOUT) == DEFAULT_SHUTDOWN_TIMEOUT + 10
    assert stop_bound({"DYN_SHUTDOWN_TIMEOUT": "120"}) == 130
    assert stop_bound({"DYN_SHUTDOWN_TIMEOUT": "2.5"}) == 12.5
    # The child's runtime refuses these at its start (its own rule, the one read here).
    for unusable in ("soon", "0", "-1", "nan", "inf"):
        assert stop_bound({"DYN_SHUTDOWN_TIMEOUT": unusable}) == DEFAULT_SHUTDOWN_TIMEOUT + 10
    assert stop_bound({"DYN_SHUTDOWN_TIMEOUT": "120", "DYN_TCP_PORT": "x"}) == DEFAULT_SHUTDOWN_TIMEOUT + 10
    specs = [ChildSpec("a", ["true"], {"DYN_SHUTDOWN_TIMEOUT": "5"}), ChildSpec("b", ["true"])]
    sup = Supervisor(specs, name="sup")
    assert [sup._stop_timeout_of(c) for c in sup.children] == [15, 40]
    monkeypatch.setenv("DYN_SHUTDOWN_TIMEOUT", "60")
    assert [sup._stop_timeout_of(c) for c in sup.children] == [15, 70]
    explicit = Supervisor(specs, name="sup", stop_timeout=2)
    assert [explicit._stop_timeout_of(c) for c in explicit.children] == [2, 2]

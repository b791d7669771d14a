"""The ``local`` connector: worker processes on this machine, started and stopped by the
planner itself.

Each replica is ``roles.<role>.command`` run in its own process group inside the
planner's session (``dynamo.supervisor``'s child setup: stopping it stops what it
started, and it dies with the planner), its output prefixed ``role[n] | ``, with
``DYN_SYSTEM_ENABLED=true`` and a port of its own for its system server. It is
*pending* until that server answers ``/ready`` with 200 (or, where the worker has no
``/ready`` yet, ``/health`` with 200 listing served endpoints), then *ready*. Removing
a replica takes a pending one first (newest first), else the newest ready one, and
drains it: SIGTERM (the worker leaves discovery and finishes its streams), SIGKILL only
after ``stop_timeout_s``. ``startup_delay_s`` holds each start back, to emulate slow
starts in experiments.

The process primitives are the supervisor's (``dynamo.supervisor``: child setup, free
port, output prefixing, ``/ready`` status, drain-then-kill), so a replica is started,
shown and stopped exactly as ``dynamo serve`` does it. TODO(supervisor): the
``Supervisor`` class itself runs a fixed list of children; once it can add and stop one
child while the others run, this module should hand it specs instead of keeping its own
list of replicas.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from dynamo.planner.config import LocalConnectorConfig, PlannerConfig
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.decide import RoleState
from dynamo.supervisor import child_setup, free_port, pump_output, ready_status, stop_group

log = logging.getLogger("dynamo.planner.local")

#: Seconds between two readiness probes of a pending replica, and bound on one probe.
PROBE_INTERVAL = 0.2
PROBE_TIMEOUT = 1.0


def _probe(port: int) -> bool:
    """Whether the worker's system server says it is ready (blocking; run in a thread)."""
    status = ready_status(port)
    if status != 404:
        return status == 200
    # No /ready on this worker: healthy and serving at least one endpoint.
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=PROBE_TIMEOUT) as response:
            return response.status == 200 and bool(json.loads(response.read()).get("endpoints"))
    except (OSError, ValueError):
        return False


@dataclass
class _Replica:
    label: str
    port: int
    created: float = field(default_factory=time.monotonic)
    proc: asyncio.subprocess.Process | None = None
    ready_at: float | None = None
    task: asyncio.Task[None] | None = None


class LocalConnector:
    """Worker processes of each role on this machine (see the module's docstring)."""

    name = "local"

    def __init__(self, config: PlannerConfig) -> None:
        assert isinstance(config.connector, LocalConnectorConfig)
        self.config = config
        self.settings: LocalConnectorConfig = config.connector
        self.fleet: dict[str, list[_Replica]] = {role: [] for role in config.roles}
        self.draining: set[asyncio.Task[None]] = set()
        self.started = 0

    async def replicas(self) -> dict[str, RoleState]:
        self._reap()
        return {
            role: RoleState(
                ready=sum(r.ready_at is not None for r in replicas),
                pending=sum(r.ready_at is None for r in replicas),
            )
            for role, replicas in self.fleet.items()
        }

    def _reap(self) -> None:
        """Forget replicas that exited by themselves, and finished drains."""
        for replicas in self.fleet.values():
            for r in [r for r in replicas if r.task is not None and r.task.done()]:
                replicas.remove(r)
                status = r.proc.returncode if r.proc is not None else None
                error = None if r.task is None or r.task.cancelled() else r.task.exception()
                log.warning("%s exited by itself (status %s%s)", r.label, status, f", {error}" if error else "")
        for task in [t for t in self.draining if t.done()]:
            self.draining.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("draining a replica failed: %s", task.exception())

    async def scale(self, role: str, target: int, reason: str) -> None:
        replicas = self.fleet[role]
        command = self.config.roles[role].command
        if len(replicas) < target and not command:
            raise ConnectorError(ConnectorErrorKind.START_FAILED, f"roles.{role}.command is empty: cannot start one")
        while len(replicas) < target:
            self.started += 1
            replica = _Replica(label=f"{role}[{self.started}]", port=free_port())
            replica.task = asyncio.create_task(self._run(replica, command))
            replicas.append(replica)
            log.info("starting %s (%s)", replica.label, reason)
        while len(replicas) > target:
            pending = [r for r in replicas if r.ready_at is None]
            victim = max(pending or replicas, key=lambda r: r.created)
            replicas.remove(victim)
            log.info("draining %s (%s)", victim.label, "pending" if victim.ready_at is None else "ready")
            self.draining.add(asyncio.create_task(self._drain(victim)))

    async def _run(self, replica: _Replica, command: list[str]) -> None:
        """Start one replica (after the start-up delay), pump its output, probe it until
        ready, and return when it exits."""
        if self.settings.startup_delay_s:
            await asyncio.sleep(self.settings.startup_delay_s)
        env = {**os.environ, **self.settings.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": str(replica.port)}
        try:
            replica.proc = await asyncio.create_subprocess_exec(
                *command, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT, preexec_fn=child_setup,
            )
        except OSError as e:
            raise ConnectorError(ConnectorErrorKind.START_FAILED, f"{replica.label}: {e}") from e
        log.info("started %s (pid %d, system port %d)", replica.label, replica.proc.pid, replica.port)
        await asyncio.gather(pump_output(replica.label, replica.proc), self._until_ready(replica, replica.proc))
        await replica.proc.wait()

    async def _until_ready(self, replica: _Replica, proc: asyncio.subprocess.Process) -> None:
        while proc.returncode is None:
            if await asyncio.to_thread(_probe, replica.port):
                replica.ready_at = time.monotonic()
                log.info("%s is ready after %.1fs", replica.label, replica.ready_at - replica.created)
                return
            await asyncio.sleep(PROBE_INTERVAL)

    async def _drain(self, replica: _Replica) -> None:
        """SIGTERM, wait (bounded), SIGKILL; a replica not started yet is just cancelled."""
        task = replica.task
        assert task is not None
        proc = replica.proc
        if proc is None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectorError):
                await task
            return
        await stop_group(proc, self.settings.stop_timeout_s, lambda text: log.warning("%s: %s", replica.label, text))
        await task
        log.info("%s stopped (status %s)", replica.label, proc.returncode)

    async def close(self) -> None:
        for role in self.fleet:
            await self.scale(role, 0, "planner stopping")
        if self.draining:
            await asyncio.gather(*self.draining, return_exceptions=True)
        self.draining.clear()

"""The ``local`` connector: worker processes on this machine, started and stopped by the
planner through the process supervisor (``dynamo.supervisor``, the one ``dynamo serve``
runs).

Each replica is ``roles.<role>.command`` added to one ``Supervisor`` as a ``probe`` child
labelled ``role[n]``: its own process group inside the planner's session (stopping it
stops what it started, and it dies with the planner), its output prefixed ``role[n] | ``,
its system server on a free port it binds and reports (``DYN_SYSTEM_PORT_FILE``). It is *pending* until that server
answers ``/ready`` with 200 (bounded by ``ready_timeout_s``; one that never does stays
pending), then *ready*. Removing a replica takes a pending one first (newest first),
else the newest ready one, and drains it (``Supervisor.stop_child``: SIGTERM, the worker
leaves discovery and finishes its streams; SIGKILL only after ``stop_timeout_s``, by
default the worker's own drain bound plus 10 s: ``dynamo.supervisor.stop_bound``).
``startup_delay_s`` holds each start back (the child's ``start_delay``), to emulate slow
starts in experiments. A worker that exits by itself is reported by the supervisor,
not restarted, and forgotten here; the planner starts another if it is still needed.
"""

from __future__ import annotations

import asyncio
import logging

from dynamo.planner.config import LocalConnectorConfig, PlannerConfig
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.decide import RoleState
from dynamo.supervisor import Child, ChildSpec, Supervisor

log = logging.getLogger("dynamo.planner.local")


class LocalConnector:
    """Worker processes of each role on this machine (see the module's docstring)."""

    name = "local"

    def __init__(self, config: PlannerConfig) -> None:
        assert isinstance(config.connector, LocalConnectorConfig)
        self.config = config
        self.settings: LocalConnectorConfig = config.connector
        self.supervisor = Supervisor(
            name="planner", group="the workers", stop_timeout=self.settings.stop_timeout_s,
            ready_timeout=self.settings.ready_timeout_s, stop_all_on_failure=False,
        )
        self.fleet: dict[str, list[Child]] = {role: [] for role in config.roles}
        self.draining: set[asyncio.Task[int | None]] = set()
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
        """Forget replicas that ended by themselves, and finished drains."""
        for replicas in self.fleet.values():
            for r in [r for r in replicas if r.ended]:
                replicas.remove(r)
                status = r.proc.returncode if r.proc is not None else None
                log.warning("%s exited by itself (status %s)", r.label, status)
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
            spec = ChildSpec(
                f"{role}[{self.started}]", list(command), dict(self.settings.env), probe=True,
                start_delay=self.settings.startup_delay_s,
            )
            replicas.append(self.supervisor.add(spec))
            log.info("starting %s (%s)", spec.label, reason)
        while len(replicas) > target:
            pending = [r for r in replicas if r.ready_at is None]
            victim = max(pending or replicas, key=lambda r: r.created)
            replicas.remove(victim)
            log.info("draining %s (%s)", victim.label, "pending" if victim.ready_at is None else "ready")
            self.draining.add(asyncio.create_task(self.supervisor.stop_child(victim)))

    async def close(self) -> None:
        for role in self.fleet:
            await self.scale(role, 0, "planner stopping")
        if self.draining:
            await asyncio.gather(*self.draining, return_exceptions=True)
        self.draining.clear()
        await self.supervisor.close()

"""The ``virtual`` connector: the planner publishes its decisions in discovery's
key-value store, and an external actor (a script, an operator, a human) carries them out
and reports back.

The protocol (keys under ``connector.prefix``, values JSON, docs/planner.md "virtual"):

* ``{prefix}/decision/{role}`` — written by the planner (bound to its lease: it vanishes
  with the planner): ``{"id": 7, "role": "agg", "replicas": 3, "reason": "...",
  "at": 1767225600.0}``. ``id`` grows by one with every decision of the planner.
* ``{prefix}/report/{role}`` — written by the actor once the role holds the decision's
  replicas: ``{"id": 7, "ready": 3, "pending": 0}`` (``id``: the last decision it
  carried out). The actor may rewrite it at any time to report progress (``pending``:
  replicas asked for and not ready yet).

``scale`` returns once a report carries the decision's ``id`` (or a later one) and fails
with a ``timeout`` error after ``report_timeout_s``; ``replicas`` reads the reports (a
role without a report has no replicas known).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from dynamo.planner.config import PlannerConfig, VirtualConnectorConfig
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.decide import RoleState

#: Seconds between two reads of a report while waiting for it.
POLL_INTERVAL = 0.1


class VirtualConnector:
    """Decisions out through discovery, reports back (see the module's docstring)."""

    name = "virtual"

    def __init__(self, config: PlannerConfig, kv: Any) -> None:
        assert isinstance(config.connector, VirtualConnectorConfig)
        self.config = config
        self.settings: VirtualConnectorConfig = config.connector
        self.kv = kv
        self.next_id = 1

    def decision_key(self, role: str) -> str:
        """Where the decision of ``role`` is published."""
        return f"{self.settings.prefix}/decision/{role}"

    def report_key(self, role: str) -> str:
        """Where the actor reports on ``role``."""
        return f"{self.settings.prefix}/report/{role}"

    async def _report(self, role: str) -> dict[str, Any] | None:
        try:
            raw = await self.kv.kv_get(self.report_key(role))
        except Exception as e:  # the binding raises DynamoError subclasses
            raise ConnectorError(ConnectorErrorKind.UNREACHABLE, f"reading {self.report_key(role)}: {e}") from e
        if raw is None:
            return None
        try:
            report = json.loads(raw)
        except ValueError:
            return None
        return report if isinstance(report, dict) else None

    async def replicas(self) -> dict[str, RoleState]:
        states = {}
        for role in self.config.roles:
            report = await self._report(role) or {}
            states[role] = RoleState(ready=int(report.get("ready") or 0), pending=int(report.get("pending") or 0))
        return states

    async def scale(self, role: str, target: int, reason: str) -> None:
        decision_id = self.next_id
        self.next_id += 1
        decision = {"id": decision_id, "role": role, "replicas": target, "reason": reason, "at": time.time()}
        try:
            await self.kv.kv_put(self.decision_key(role), json.dumps(decision).encode())
        except Exception as e:
            raise ConnectorError(ConnectorErrorKind.UNREACHABLE, f"publishing {self.decision_key(role)}: {e}") from e
        deadline = time.monotonic() + self.settings.report_timeout_s
        while True:
            report = await self._report(role)
            if report is not None and int(report.get("id") or 0) >= decision_id:
                return
            if time.monotonic() >= deadline:
                raise ConnectorError(
                    ConnectorErrorKind.TIMEOUT,
                    f"no report on {self.report_key(role)} for decision {decision_id} "
                    f"within {self.settings.report_timeout_s:g}s",
                )
            await asyncio.sleep(POLL_INTERVAL)

    async def close(self) -> None:
        """Nothing held: the decisions vanish with the planner's lease."""

"""The one interface through which the planner acts on a fleet, and its factory.

Three implementations, one module each under ``connectors/``: ``local`` (worker processes
on this machine), ``virtual`` (decisions published in discovery for an external actor)
and ``kubernetes`` (the scale subresource of the rendered Deployments). A connector
reports each role's replicas as ready or pending and sets a role's replica count;
scale-down always drains (the replica gets SIGTERM, leaves discovery, finishes its
streams; docs/planner.md, "Connectors").
"""

from __future__ import annotations

import enum
from typing import Any, Protocol

from dynamo.planner.config import PlannerConfig
from dynamo.planner.decide import RoleState


class ConnectorErrorKind(enum.Enum):
    """What went wrong when acting on the fleet."""

    #: The connector cannot reach what it drives (API server, discovery).
    UNREACHABLE = "unreachable"
    #: What the connector looked for is not there (no Deployment with the labels).
    NOT_FOUND = "not_found"
    #: The actor did not confirm within its bound.
    TIMEOUT = "timeout"
    #: Starting a worker failed.
    START_FAILED = "start_failed"


class ConnectorError(Exception):
    """A connector could not do what it was asked; ``kind`` says why."""

    def __init__(self, kind: ConnectorErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Connector(Protocol):
    """Acts on the fleet for the planner."""

    #: ``local``, ``virtual`` or ``kubernetes``.
    name: str

    async def replicas(self) -> dict[str, RoleState]:
        """Each role's replicas, ready and pending (started, not ready yet).

        Raises:
            ConnectorError: the fleet cannot be read.
        """

    async def scale(self, role: str, target: int, reason: str) -> None:
        """Make ``role`` hold ``target`` replicas (removing drains; pending ones go first
        where the connector can choose). Bounded.

        Raises:
            ConnectorError: the change could not be made or confirmed.
        """

    async def close(self) -> None:
        """Release what the connector holds (the local one stops its workers, draining)."""


def make_connector(config: PlannerConfig, runtime: Any = None) -> Connector:
    """The connector ``config.connector`` names. ``runtime`` (a ``DistributedRuntime``)
    is needed by ``virtual`` (its key-value store)."""
    kind = config.connector.kind
    if kind == "local":
        from dynamo.planner.connectors.local import LocalConnector

        return LocalConnector(config)
    if kind == "virtual":
        from dynamo.planner.connectors.virtual import VirtualConnector

        if runtime is None:
            raise ValueError("the virtual connector needs a DistributedRuntime")
        return VirtualConnector(config, runtime.kv_store())
    from dynamo.planner.connectors.kubernetes import KubernetesConnector

    return KubernetesConnector(config)

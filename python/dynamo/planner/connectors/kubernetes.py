"""The ``kubernetes`` connector: ``replicas`` of the Deployments that ``dynamo deploy``
rendered, set through their scale subresource with the official client.

Each role's Deployment is found by its labels, ``dynamo.ai/graph={connector.graph}`` and
``dynamo.ai/service={roles.<role>.service}`` (python/dynamo/sdk/deploy/kubernetes.py);
exactly one must match. Ready replicas are the Deployment's ``readyReplicas``, pending
ones the rest of ``spec.replicas``. Scale-down drains by the pods' own contract
(docs/deploy.md, "Readiness and drain": SIGTERM, ``/ready`` 503, streams finish within
the grace period); the ReplicaSet controller removes not-ready pods first, so a pending
replica goes before a serving one. The kubeconfig is read as ``dynamo deploy --apply``
reads it (``dynamo.sdk.deploy.apply.connect``).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from dynamo.planner.config import KubernetesConnectorConfig, PlannerConfig
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.decide import RoleState

GRAPH_LABEL, SERVICE_LABEL = "dynamo.ai/graph", "dynamo.ai/service"
#: Seconds one API request may take.
REQUEST_TIMEOUT = 10


class KubernetesConnector:
    """Scales the rendered Deployments (see the module's docstring)."""

    name = "kubernetes"

    def __init__(self, config: PlannerConfig, api_client: Any = None, namespace: str | None = None) -> None:
        assert isinstance(config.connector, KubernetesConnectorConfig)
        self.config = config
        self.settings: KubernetesConnectorConfig = config.connector
        for role, spec in config.roles.items():
            if not spec.service:
                raise ConnectorError(ConnectorErrorKind.NOT_FOUND, f"roles.{role}.service is not set")
        if api_client is None:
            from dynamo.sdk.deploy.apply import connect
            from dynamo.sdk.deploy.errors import DeployError

            try:
                api_client, context_namespace = connect()
            except DeployError as e:
                raise ConnectorError(ConnectorErrorKind.UNREACHABLE, str(e)) from e
            namespace = namespace or context_namespace
        from kubernetes import client

        self.apps = client.AppsV1Api(api_client)
        self.namespace = self.settings.namespace or namespace or "default"

    def _selector(self, role: str) -> str:
        return f"{GRAPH_LABEL}={self.settings.graph},{SERVICE_LABEL}={self.config.roles[role].service}"

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """``fn``'s answer as the API server's JSON (the client's models are not built:
        they reject objects the server may trim, and the planner reads three fields)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            response = await asyncio.to_thread(
                fn, *args, _request_timeout=REQUEST_TIMEOUT, _preload_content=False, **kwargs
            )
            return json.loads(response.data) if response.data else {}
        except ApiException as e:
            kind = ConnectorErrorKind.NOT_FOUND if e.status == 404 else ConnectorErrorKind.UNREACHABLE
            raise ConnectorError(kind, f"{what}: {e.status} {e.reason}") from e
        except HTTPError as e:
            raise ConnectorError(ConnectorErrorKind.UNREACHABLE, f"{what}: the API server does not answer: {e}") from e
        except ValueError as e:
            raise ConnectorError(ConnectorErrorKind.UNREACHABLE, f"{what}: not JSON: {e}") from e

    async def _deployment(self, role: str) -> dict[str, Any]:
        selector = self._selector(role)
        found = await self._call(
            f"listing Deployments {selector}", self.apps.list_namespaced_deployment, self.namespace,
            label_selector=selector,
        )
        items = found.get("items") or []
        if len(items) != 1:
            raise ConnectorError(
                ConnectorErrorKind.NOT_FOUND,
                f"{len(items)} Deployments in {self.namespace} match {selector} (one expected)",
            )
        return items[0]

    async def replicas(self) -> dict[str, RoleState]:
        states = {}
        for role in self.config.roles:
            d = await self._deployment(role)
            desired = int(d.get("spec", {}).get("replicas") or 0)
            ready = min(int((d.get("status") or {}).get("readyReplicas") or 0), desired)
            states[role] = RoleState(ready=ready, pending=desired - ready)
        return states

    async def scale(self, role: str, target: int, reason: str) -> None:
        name = (await self._deployment(role))["metadata"]["name"]
        await self._call(
            f"scaling Deployment {name}", self.apps.patch_namespaced_deployment_scale, name, self.namespace,
            {"spec": {"replicas": target}},
        )

    async def close(self) -> None:
        """Nothing held: the Deployments keep their replicas."""

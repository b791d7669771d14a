"""``dynamo deploy --apply``: server-side apply of the rendered objects with the official
``kubernetes`` client (field manager ``dynamo``), to the current kubeconfig context, then a
bounded wait until every Deployment is ready, with progress on a text stream."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO

from dynamo.sdk.deploy.errors import DeployError, DeployErrorKind

FIELD_MANAGER = "dynamo"
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"
#: (apiVersion, kind) → (API path prefix, resource), for every kind the renderer emits.
RESOURCES = {
    ("v1", "ConfigMap"): ("/api/v1", "configmaps"),
    ("v1", "Service"): ("/api/v1", "services"),
    ("apps/v1", "Deployment"): ("/apis/apps/v1", "deployments"),
    ("apps/v1", "StatefulSet"): ("/apis/apps/v1", "statefulsets"),
    ("policy/v1", "PodDisruptionBudget"): ("/apis/policy/v1", "poddisruptionbudgets"),
    ("networking.k8s.io/v1", "Ingress"): ("/apis/networking.k8s.io/v1", "ingresses"),
}
#: Seconds between two readiness polls.
POLL_INTERVAL = 2.0
#: (connect, read) timeout of one API request, seconds.
REQUEST_TIMEOUT = (5.0, 30.0)


@dataclass(frozen=True)
class Rollout:
    """A Deployment's progress towards its desired replicas."""

    name: str
    desired: int
    ready: int
    updated: int
    current: bool

    @property
    def done(self) -> bool:
        """The controller saw the latest spec and every replica is updated and ready."""
        return self.current and self.updated == self.desired and self.ready == self.desired

    def __str__(self) -> str:
        return f"{self.name} {self.ready}/{self.desired}"


def connect(context: str | None = None) -> tuple[Any, str]:
    """An API client for the kubeconfig's current context (``KUBECONFIG``, else
    ``~/.kube/config``) or ``context``, and that context's namespace (``default``)."""
    try:
        from kubernetes import config
    except ImportError:
        raise DeployError(
            DeployErrorKind.API, "--apply needs the kubernetes client: pip install 'ai-dynamo[deploy]'"
        ) from None
    try:
        contexts, active = config.list_kube_config_contexts()
        chosen = next((c for c in contexts if c["name"] == context), None) if context else active
        if chosen is None:
            raise DeployError(DeployErrorKind.API, f"no context {context!r} in the kubeconfig")
        client = config.new_client_from_config(context=chosen["name"])
    except (config.ConfigException, OSError) as exc:
        raise DeployError(DeployErrorKind.API, f"cannot load the kubeconfig: {exc}") from exc
    return client, chosen.get("context", {}).get("namespace") or "default"


def object_path(obj: dict[str, Any], namespace: str) -> str:
    """The API path of ``obj`` in ``namespace``."""
    try:
        prefix, resource = RESOURCES[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise DeployError(DeployErrorKind.INVALID, f"cannot apply a {obj['apiVersion']} {obj['kind']}") from None
    return f"{prefix}/namespaces/{namespace}/{resource}/{obj['metadata']['name']}"


class Applier:
    """Applies objects and reads Deployments through one API client."""

    def __init__(self, client: Any, namespace: str) -> None:
        self.client = client
        self.namespace = namespace

    def _call(self, method: str, path: str, query: list[tuple[str, str]], body: Any = None) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = APPLY_CONTENT_TYPE
        try:
            response = self.client.call_api(
                path, method, query_params=query, header_params=headers, body=body,
                auth_settings=["BearerToken"], _preload_content=False, _request_timeout=REQUEST_TIMEOUT,
            )
        except ApiException as exc:
            raise DeployError(DeployErrorKind.API, f"{method} {path}: {exc.status} {_status_message(exc)}") from exc
        except HTTPError as exc:
            raise DeployError(DeployErrorKind.API, f"{method} {path}: the API server does not answer: {exc}") from exc
        # Without preloading, the client returns the urllib3 response itself.
        return json.loads(response.data) if response.data else {}

    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply ``obj`` (forcing ownership of its fields to ``dynamo``)."""
        body = copy.deepcopy(obj)
        body["metadata"]["namespace"] = self.namespace
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return self._call("PATCH", object_path(body, self.namespace), query, body)

    def rollout(self, name: str) -> Rollout:
        """The Deployment's progress as the API server reports it now."""
        path = object_path({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name}}, self.namespace)
        deployment = self._call("GET", path, [])
        spec, status = deployment.get("spec", {}), deployment.get("status", {})
        generation = deployment.get("metadata", {}).get("generation", 0)
        return Rollout(
            name=name,
            desired=int(spec.get("replicas", 1)),
            ready=int(status.get("readyReplicas", 0)),
            updated=int(status.get("updatedReplicas", 0)),
            current=int(status.get("observedGeneration", 0)) >= int(generation),
        )


def _status_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def apply_all(applier: Applier, objects: list[dict[str, Any]], progress: TextIO, dry_run: bool = False) -> None:
    """Apply every object in order, a line on ``progress`` for each."""
    for obj in objects:
        applier.apply(obj, dry_run)
        suffix = " (server dry run)" if dry_run else ""
        print(f"applied {obj['kind']}/{obj['metadata']['name']} in {applier.namespace}{suffix}", file=progress)


def wait_ready(
    applier: Applier,
    deployments: list[str],
    timeout: float,
    progress: TextIO,
    poll_interval: float = POLL_INTERVAL,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Poll until every Deployment is ready; a line on ``progress`` whenever one moves.
    Raises a ``TIMEOUT`` DeployError naming the laggards after ``timeout`` seconds."""
    start = clock()
    last: dict[str, Rollout] = {}
    while True:
        rollouts = [applier.rollout(name) for name in deployments]
        elapsed = clock() - start
        changed = [r for r in rollouts if last.get(r.name) != r]
        if changed:
            done = sum(r.done for r in rollouts)
            states = ", ".join(str(r) for r in rollouts)
            print(f"[{elapsed:5.0f}s] {done}/{len(rollouts)} deployments ready: {states}", file=progress, flush=True)
        last = {r.name: r for r in rollouts}
        if all(r.done for r in rollouts):
            return
        if elapsed >= timeout:
            waiting = ", ".join(str(r) for r in rollouts if not r.done)
            raise DeployError(DeployErrorKind.TIMEOUT, f"not ready after {timeout:g}s: {waiting}")
        sleep(min(poll_interval, max(0.0, timeout - elapsed)))

"""A resolved graph as plain Kubernetes objects (dicts): per service a ConfigMap and a
Deployment (and a PodDisruptionBudget for workers), the frontend's Service and optional
Ingress, and the platform (``platform``) unless existing etcd/NATS endpoints are given.
The output is deterministic: objects in apply order, keys sorted when dumped."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import yaml

from dynamo.sdk.deploy import lifecycle, platform
from dynamo.sdk.deploy.errors import DeployError, DeployErrorKind
from dynamo.sdk.deploy.graph import CONTAINER_WORKDIR, DeployedService, ResolvedGraph, dns_label
from dynamo.sdk.lib.config import CONFIG_ENV
from dynamo.sdk.lib.image import DYNAMO_IMAGE

#: Label keys a planner (or kubectl) selects on.
GRAPH_LABEL, SERVICE_LABEL, ROLE_LABEL = "dynamo.ai/graph", "dynamo.ai/service", "dynamo.ai/role"
NAMESPACE_LABEL = "dynamo.ai/namespace"
#: Pod annotation with the digest of the graph's configuration (a change rolls the pods).
CONFIG_DIGEST_ANNOTATION = "dynamo.ai/config-digest"
#: The ConfigMap key that holds the configuration (the variable ``dynamo serve`` sets).
CONFIG_KEY = CONFIG_ENV
#: The ConfigMap key with the service's own resolved configuration, for readers.
RESOLVED_KEY = "resolved.yaml"
SHUTDOWN_TIMEOUT_ENV = "DYN_SHUTDOWN_TIMEOUT"
GPU_RESOURCE = "nvidia.com/gpu"

#: The order objects are applied in (the platform first, the frontend's entry last).
KIND_ORDER = ("StatefulSet", "ConfigMap", "Service", "Deployment", "PodDisruptionBudget", "Ingress")


@dataclass(frozen=True)
class RenderOptions:
    """What the command line adds to the graph."""

    #: The Kubernetes namespace of every object (None: the one kubectl applies to).
    namespace: str | None = None
    #: Image of every service (else its ``ServiceArgs.image``, else ``DYNAMO_IMAGE``).
    image: str | None = None
    #: Existing etcd endpoints (``http://host:2379``) instead of a platform StatefulSet.
    etcd: str | None = None
    #: An existing NATS server (``nats://host:4222``) instead of a platform StatefulSet.
    nats: str | None = None
    #: Host name of an Ingress to the frontend's Service (None: no Ingress).
    ingress_host: str | None = None
    #: ``ingressClassName`` of that Ingress.
    ingress_class: str | None = None
    #: ``DYN_SHUTDOWN_TIMEOUT`` of services whose ``envs`` do not set it.
    shutdown_timeout: int = lifecycle.DEFAULT_SHUTDOWN_TIMEOUT
    etcd_image: str = platform.ETCD_IMAGE
    nats_image: str = platform.NATS_IMAGE


def render(graph: ResolvedGraph, options: RenderOptions) -> list[dict[str, Any]]:
    """Every object of the graph's deployment, in apply order."""
    objects: list[dict[str, Any]] = []
    etcd, nats = options.etcd, options.nats
    if etcd is None:
        etcd_objects, etcd = platform.etcd(graph.name, options.etcd_image, _labels(graph, None, "platform"))
        objects += etcd_objects
    if nats is None:
        nats_objects, nats = platform.nats(graph.name, options.nats_image, _labels(graph, None, "platform"))
        objects += nats_objects
    for service in graph.services:
        objects.append(_config_map(graph, service))
        objects.append(_deployment(graph, service, options, etcd, nats))
        if service.role == "worker":
            objects.append(_disruption_budget(graph, service))
    frontend = graph.frontend()
    if frontend is not None:
        objects.append(_frontend_service(graph, frontend))
        if options.ingress_host:
            objects.append(_ingress(graph, frontend, options))
    elif options.ingress_host:
        raise DeployError(DeployErrorKind.INVALID, f"--ingress: the graph {graph.name} has no HTTP frontend")
    if options.namespace:
        for obj in objects:
            obj["metadata"]["namespace"] = options.namespace
    return sorted(objects, key=lambda o: (KIND_ORDER.index(o["kind"]), o["metadata"]["name"]))


class _ManifestDumper(yaml.SafeDumper):
    """Plain YAML for people and kubectl: no anchors, multi-line strings as blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_ManifestDumper.add_representer(str, _str)


def dump(objects: list[dict[str, Any]]) -> str:
    """The objects as one multi-document YAML text (sorted keys: the same graph gives the same bytes)."""
    return yaml.dump_all(
        objects, Dumper=_ManifestDumper, sort_keys=True, default_flow_style=False, explicit_start=True, width=1000
    )


def object_name(graph: ResolvedGraph, service: DeployedService) -> str:
    """The name of the service's objects: ``<graph>-<service>`` (``agg-prefill-worker``)."""
    name = f"{graph.name}-{dns_label(service.name)}"
    if len(name) > 63:
        raise DeployError(DeployErrorKind.INVALID, f"{name!r} is longer than 63 characters; choose a shorter --name")
    return name


def _labels(graph: ResolvedGraph, service: DeployedService | None, role: str) -> dict[str, str]:
    labels = {
        "app.kubernetes.io/managed-by": "dynamo",
        "app.kubernetes.io/part-of": graph.name,
        GRAPH_LABEL: graph.name,
        ROLE_LABEL: role,
    }
    if service is not None:
        labels["app.kubernetes.io/name"] = object_name(graph, service)
        labels[SERVICE_LABEL] = service.name
        labels[NAMESPACE_LABEL] = service.plan.namespace
    return labels


def _selector(graph: ResolvedGraph, service: DeployedService) -> dict[str, str]:
    return {GRAPH_LABEL: graph.name, SERVICE_LABEL: service.name}


def _metadata(graph: ResolvedGraph, service: DeployedService, name: str) -> dict[str, Any]:
    return {"name": name, "labels": _labels(graph, service, service.role)}


def _config_map(graph: ResolvedGraph, service: DeployedService) -> dict[str, Any]:
    resolved = yaml.safe_dump({service.name: service.plan.config}, sort_keys=True, default_flow_style=False)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(graph, service, f"{object_name(graph, service)}-config"),
        "data": {CONFIG_KEY: graph.config_json, RESOLVED_KEY: resolved},
    }


def _resources(service: DeployedService) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, Any] = {}
    for key, value in sorted(service.plan.args.resources.items()):
        if key == "gpu":
            gpus = float(value)
            if gpus != int(gpus):
                raise DeployError(
                    DeployErrorKind.INVALID,
                    f"{service.name}: resources.gpu={value!r}; Kubernetes schedules whole GPUs (set 1 or more)",
                )
            if gpus > 0:
                limits[GPU_RESOURCE] = int(gpus)
        elif key in ("cpu", "memory"):
            requests[key] = limits[key] = str(value)
        else:
            raise DeployError(
                DeployErrorKind.INVALID, f"{service.name}: unknown resource {key!r} (known: gpu, cpu, memory)"
            )
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _shutdown_timeout(service: DeployedService, options: RenderOptions) -> int:
    raw = service.plan.args.envs.get(SHUTDOWN_TIMEOUT_ENV)
    if raw is None:
        return options.shutdown_timeout
    try:
        return int(float(raw))
    except ValueError:
        raise DeployError(
            DeployErrorKind.INVALID, f"{service.name}: envs.{SHUTDOWN_TIMEOUT_ENV} must be seconds, got {raw!r}"
        ) from None


def _env(
    graph: ResolvedGraph, service: DeployedService, etcd: str, nats: str, shutdown_timeout: int
) -> list[dict[str, Any]]:
    values = {
        **service.plan.args.envs,
        "DYN_DISCOVERY_BACKEND": "etcd",
        "ETCD_ENDPOINTS": etcd,
        "DYN_REQUEST_PLANE": "nats",
        "DYN_EVENT_PLANE": "nats",
        "NATS_SERVER": nats,
        "DYN_SYSTEM_ENABLED": "true",
        "DYN_SYSTEM_PORT": str(lifecycle.SYSTEM_PORT),
        SHUTDOWN_TIMEOUT_ENV: str(shutdown_timeout),
        "DYNAMO_SERVICE_NAME": service.name,
        "PYTHONPATH": CONTAINER_WORKDIR,
        "PYTHONUNBUFFERED": "1",
    }
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in sorted(values.items())]
    config_ref = {"configMapKeyRef": {"name": f"{object_name(graph, service)}-config", "key": CONFIG_KEY}}
    env.append({"name": CONFIG_ENV, "valueFrom": config_ref})
    return sorted(env, key=lambda e: e["name"])


def _deployment(
    graph: ResolvedGraph, service: DeployedService, options: RenderOptions, etcd: str, nats: str
) -> dict[str, Any]:
    name = object_name(graph, service)
    shutdown_timeout = _shutdown_timeout(service, options)
    ports = [{"name": "system", "containerPort": lifecycle.SYSTEM_PORT, "protocol": "TCP"}]
    if service.http_port is not None:
        ports.append({"name": "http", "containerPort": service.http_port, "protocol": "TCP"})
    container: dict[str, Any] = {
        "name": dns_label(service.name),
        "image": options.image or service.plan.args.image or DYNAMO_IMAGE,
        "command": list(service.command),
        "workingDir": CONTAINER_WORKDIR,
        "env": _env(graph, service, etcd, nats, shutdown_timeout),
        "ports": ports,
        **lifecycle.probes(
            "http" if service.probes_on_http else "system",
            lifecycle.READY_PATH if service.plan.probe or service.probes_on_http else lifecycle.LIVE_PATH,
        ),
    }
    resources = _resources(service)
    if resources:
        container["resources"] = resources
    prestop = 0
    if service.role == "frontend":
        prestop = lifecycle.FRONTEND_PRESTOP_SECONDS
        container["lifecycle"] = lifecycle.prestop_sleep(prestop)
    digest = hashlib.sha256(graph.config_json.encode()).hexdigest()
    labels = _labels(graph, service, service.role)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(graph, service, name),
        "spec": {
            "replicas": service.plan.workers,
            "selector": {"matchLabels": _selector(graph, service)},
            # A new pod must be ready before an old one stops: N-1 never drops below N.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {"labels": labels, "annotations": {CONFIG_DIGEST_ANNOTATION: digest[:16]}},
                "spec": {
                    "terminationGracePeriodSeconds": lifecycle.grace_period(prestop, shutdown_timeout),
                    "containers": [container],
                },
            },
        },
    }


def _disruption_budget(graph: ResolvedGraph, service: DeployedService) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(graph, service, object_name(graph, service)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": _selector(graph, service)}},
    }


def _frontend_service(graph: ResolvedGraph, frontend: DeployedService) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(graph, frontend, object_name(graph, frontend)),
        "spec": {
            "type": "ClusterIP",
            "selector": _selector(graph, frontend),
            "ports": [{"name": "http", "port": frontend.http_port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def _ingress(graph: ResolvedGraph, frontend: DeployedService, options: RenderOptions) -> dict[str, Any]:
    backend = {"service": {"name": object_name(graph, frontend), "port": {"name": "http"}}}
    spec: dict[str, Any] = {
        "rules": [
            {
                "host": options.ingress_host,
                "http": {"paths": [{"path": "/", "pathType": "Prefix", "backend": backend}]},
            }
        ]
    }
    if options.ingress_class:
        spec["ingressClassName"] = options.ingress_class
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": _metadata(graph, frontend, object_name(graph, frontend)),
        "spec": spec,
    }

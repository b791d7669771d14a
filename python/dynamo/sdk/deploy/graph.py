"""A graph resolved for deployment: what ``dynamo serve`` would run for each service
(``plan_services``: the same configuration merge, settings and entry point), plus what a
cluster needs besides: the service's role, HTTP port, endpoints and edges.

``@service`` classes and ``BaseDeployment`` classes go through the same resolution, so
they reach the renderer in the same shape.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dynamo.sdk.cli.plan import ServicePlan, check_config_names, load_graph, plan_services
from dynamo.sdk.deploy.errors import DeployError, DeployErrorKind
from dynamo.sdk.deployment import BaseDeployment
from dynamo.sdk.runner import DEFAULT_PORT
from dynamo.sdk.service import DynamoService

#: Where the graph's source lives inside the container (the artifact's ``src/``).
CONTAINER_WORKDIR = "/app/src"

Role = Literal["frontend", "worker"]


@dataclass(frozen=True)
class DeployedService:
    """One service as a cluster runs it."""

    plan: ServicePlan
    role: Role
    #: The port the frontend serves HTTP on (None for workers).
    http_port: int | None
    #: Whether the probes go to the HTTP port (an HTTP frontend process such as
    #: ``python -m dynamo.frontend``) rather than the system port (a runtime process).
    probes_on_http: bool
    #: Endpoints served on the runtime.
    endpoints: tuple[str, ...]
    #: Services this one calls (the graph's edges from it).
    calls: tuple[str, ...]
    #: The entry point: ``python -m …`` (the container's command).
    command: tuple[str, ...]

    @property
    def name(self) -> str:
        """The service's name in the graph (its class name unless set)."""
        return self.plan.name


@dataclass(frozen=True)
class ResolvedGraph:
    """Every service of a graph, resolved from one merged configuration."""

    #: The graph's name on the cluster (a DNS label: ``graphs.agg`` → ``agg``).
    name: str
    #: ``module:Service`` as ``dynamo serve`` takes it.
    pipeline: str
    #: The merged configuration, as ``dynamo serve`` passes it to every process.
    config: dict[str, Any]
    #: Services, dependencies first, the root last.
    services: tuple[DeployedService, ...]
    #: Warnings about the configuration (sections naming no service).
    warnings: tuple[str, ...] = ()

    @property
    def config_json(self) -> str:
        """The configuration as the processes read it (``DYNAMO_SERVICE_CONFIG``), canonical."""
        return json.dumps(self.config, sort_keys=True, separators=(",", ":"))

    def frontend(self) -> DeployedService | None:
        """The service that takes HTTP traffic, if the graph has one."""
        return next((s for s in self.services if s.role == "frontend"), None)


def dns_label(text: str) -> str:
    """``text`` as a Kubernetes name part: ``PrefillWorker`` → ``prefill-worker``."""
    kebab = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", text).lower()
    label = re.sub(r"[^a-z0-9-]+", "-", kebab).strip("-")
    label = re.sub(r"-{2,}", "-", label)
    if not label or not label[0].isalpha():
        raise DeployError(
            DeployErrorKind.INVALID, f"{text!r} gives no valid Kubernetes name (it must start with a letter)"
        )
    return label


def default_graph_name(pipeline: str) -> str:
    """The graph's name from ``module:Service``: the module's last part (``graphs.agg`` → ``agg``)."""
    module = pipeline.partition(":")[0]
    if module.endswith(".py"):
        module = Path(module).stem
    return dns_label(module.rsplit(".", 1)[-1])



def resolve_graph(
    pipeline: str,
    working_dir: str | os.PathLike[str],
    file_config: dict[str, Any],
    overrides: dict[str, Any] | None = None,
    name: str | None = None,
) -> ResolvedGraph:
    """Import the graph from ``working_dir`` with the merged configuration and resolve
    every service as ``dynamo serve`` does (command written for ``CONTAINER_WORKDIR``)."""
    overrides = overrides or {}
    root, config = load_graph(pipeline, working_dir, file_config, overrides)
    nodes = root.all_services()
    warnings = tuple(check_config_names(nodes, file_config, overrides))
    plans = plan_services(pipeline, root, config, CONTAINER_WORKDIR)
    by_name = {_name(n): n for n in nodes}
    services = tuple(_deployed(plan, by_name[plan.name], plan.name == _name(root)) for plan in plans)
    graph_name = dns_label(name) if name else default_graph_name(pipeline)
    return ResolvedGraph(name=graph_name, pipeline=pipeline, config=config, services=services, warnings=warnings)


def _name(node: Any) -> str:
    return str(node.name)


def _deployed(plan: ServicePlan, node: Any, is_root: bool) -> DeployedService:
    role: Role = "worker"
    http_port: int | None = None
    probes_on_http = False
    if is_root and isinstance(node, DynamoService):
        has_api = bool(node.endpoints("http"))
        if has_api or "port" in plan.config:
            role = "frontend"
            http_port = int(plan.config.get("port", DEFAULT_PORT))
            # An @api web app lives in the service's runtime process (probes on the system
            # port); a root without @api runs an HTTP frontend process on `port`.
            probes_on_http = not has_api
    if isinstance(node, DynamoService):
        endpoints = tuple(node.endpoint_names())
        calls = tuple(dep.target_name for dep in node.used_dependencies().values())
    elif isinstance(node, type) and issubclass(node, BaseDeployment):
        endpoints = tuple(node.endpoint_names() or ())
        calls = tuple(d.name for d in node.linked())
    else:
        raise DeployError(DeployErrorKind.INVALID, f"{plan.name} is neither a @service nor a BaseDeployment")
    return DeployedService(
        plan=plan,
        role=role,
        http_port=http_port,
        probes_on_http=probes_on_http,
        endpoints=endpoints,
        calls=calls,
        command=("python", *plan.command),
    )


"""What ``dynamo serve`` will start: one ``ServicePlan`` per service, its processes, their
commands, environments and GPUs."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo.sdk.cli.gpus import GpuAllocator, allocation_disabled
from dynamo.sdk.deployment import BaseDeployment
from dynamo.sdk.lib.config import COMMON_SECTION, CONFIG_ENV, ServiceConfig, ServiceConfigError
from dynamo.sdk.lib.overrides import deep_merge, load_config_file, parse_overrides
from dynamo.sdk.loader import load_service
from dynamo.sdk.runner import WORKER_INDEX_ENV
from dynamo.sdk.service import DynamoService
from dynamo.sdk.service_args import ServiceArgs


def working_dir_for(pipeline: str, working_dir: str | None) -> str:
    """Where a graph is imported from: ``--working-dir``, else the module's path when it
    is a directory, else ``.`` (serve, build and deploy alike)."""
    if working_dir:
        return str(working_dir)
    module = pipeline.partition(":")[0]
    return module if Path(module).is_dir() else "."


def load_config(
    config_file: str | os.PathLike[str] | None, extra: Sequence[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(file configuration, command-line overrides) from ``-f`` and ``--Service.key=value``."""
    file_config = load_config_file(config_file) if config_file else {}
    overrides, leftover = parse_overrides(extra)
    if leftover:
        raise ServiceConfigError(f"unexpected arguments {leftover} (overrides look like --Service.key=value)")
    return file_config, overrides


def load_graph(
    pipeline: str, working_dir: str | os.PathLike[str], file_config: dict[str, Any], overrides: dict[str, Any]
) -> tuple[DynamoService, dict[str, Any]]:
    """Import the graph's root service with the merged configuration (``overrides`` over
    ``file_config``) in force; returns the root and that configuration."""
    config = deep_merge(file_config, overrides)
    # Importing the graph may read the configuration (dynamo_address(), module-level code).
    os.environ[CONFIG_ENV] = json.dumps(config)
    ServiceConfig.set_instance(config)
    return load_service(pipeline, Path(working_dir)), config


@dataclass
class ProcessPlan:
    """One child process."""

    label: str
    argv: list[str]
    env: dict[str, str]
    gpus: list[int] | None
    #: Started with its system server on a port it binds and reports, so its ``/ready`` is
    #: probed and a rolling restart (SIGHUP) replaces it: every ``dynamo.sdk.run`` process,
    #: and a ``BaseDeployment`` that declares ``endpoints``.
    probe: bool = False


@dataclass
class ServicePlan:
    """One service of the graph and its processes."""

    name: str
    namespace: str
    workers: int
    gpus_per_worker: float
    restart: str
    max_restarts: int
    config: dict[str, Any]
    #: The validated settings (resources, envs, image…) that deployment renderers read.
    args: ServiceArgs
    #: What follows the interpreter on each process's command line (``-m module …``).
    command: list[str]
    #: Whether its processes answer ``/ready`` on a system port (see ``ProcessPlan.probe``).
    probe: bool = False
    processes: list[ProcessPlan] = field(default_factory=list)


def _node_name(node: Any) -> str:
    return str(node.name)


def check_config_names(services: list[Any], file_config: dict[str, Any], overrides: dict[str, Any]) -> list[str]:
    """Fail on a command-line override naming no service of the graph (a typo would
    otherwise be silently ignored); return warnings for such file sections (a file may
    configure several graphs)."""
    names = {_node_name(s) for s in services} | {COMMON_SECTION}
    unknown = sorted(key for key in overrides if key not in names)
    if unknown:
        raise ServiceConfigError(
            f"override(s) for unknown service(s) {unknown}; the graph has {sorted(names - {COMMON_SECTION})}"
        )
    return [f"configuration section {key!r} names no service of this graph" for key in file_config if key not in names]


def plan_services(
    pipeline: str,
    root: DynamoService,
    config: dict[str, Any],
    working_dir: str,
    service_name: str | None = None,
    already_running: tuple[str, ...] = (),
) -> list[ServicePlan]:
    """What each service of ``root``'s graph (or only ``service_name``) runs with, before
    any process is planned: settings, configuration and command (``working_dir`` is
    written into the command as given). ``dynamo serve`` and the deployment renderers
    (``dynamo build``/``deploy``) share this resolution."""
    graph = root.all_services()
    nodes = [root.find(service_name)] if service_name else [s for s in graph if _node_name(s) not in already_running]
    plans: list[ServicePlan] = []
    for node in nodes:
        args = node.service_args(config)
        name = _node_name(node)
        if isinstance(node, type) and issubclass(node, BaseDeployment):
            command = ["-m", node.module()]
            # A deployment that declares endpoints registers them: its /ready says when.
            probe = bool(node.endpoints)
        else:
            command = ["-m", "dynamo.sdk.run", pipeline, "--service-name", name, "--working-dir", working_dir]
            probe = True
        plans.append(
            ServicePlan(
                name=name,
                namespace=args.dynamo.namespace,
                workers=args.workers,
                gpus_per_worker=args.gpus,
                restart=args.restart,
                max_restarts=args.max_restarts,
                config=node.effective_config(config),
                args=args,
                command=command,
                probe=probe,
            )
        )
    return plans


def build_plan(
    pipeline: str,
    root: DynamoService,
    config: dict[str, Any],
    working_dir: str,
    service_name: str | None = None,
    already_running: tuple[str, ...] = (),
    gpu_count: int = 0,
) -> list[ServicePlan]:
    """The processes to start for ``root``'s graph (or only ``service_name``)."""
    allocator = None if allocation_disabled() else GpuAllocator(gpu_count)
    config_json = json.dumps(config)
    workdir = str(Path(working_dir).resolve())
    python_path = os.pathsep.join(p for p in (workdir, os.environ.get("PYTHONPATH", "")) if p)
    plans = plan_services(pipeline, root, config, workdir, service_name, already_running)
    for plan in plans:
        args = plan.args
        name = plan.name
        argv = [sys.executable, *plan.command]
        for index in range(args.workers):
            env = {
                **args.envs,
                CONFIG_ENV: config_json,
                WORKER_INDEX_ENV: str(index),
                "DYNAMO_SERVICE_NAME": name,
                "PYTHONPATH": python_path,
                "PYTHONUNBUFFERED": "1",
            }
            gpus = None
            if allocator is not None and args.gpus > 0:
                gpus = allocator.assign(f"{name}[{index}]", args.gpus)
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            label = f"{name}[{index}]"
            plan.processes.append(ProcessPlan(label=label, argv=argv, env=env, gpus=gpus, probe=plan.probe))
    return plans


def describe(plans: list[ServicePlan], config: dict[str, Any]) -> str:
    """The dry-run report: the plan, each service's effective configuration, and the
    environment every process gets."""
    lines = ["Plan:"]
    for plan in plans:
        gpus = ", ".join(f"{p.label}: {p.env.get('CUDA_VISIBLE_DEVICES', '-')}" for p in plan.processes)
        lines.append(
            f"  {plan.name}: namespace={plan.namespace} workers={plan.workers} "
            f"gpu/worker={plan.gpus_per_worker:g} restart={plan.restart} CUDA_VISIBLE_DEVICES {{{gpus}}}"
        )
        if plan.processes:
            lines.append(f"    command: {' '.join(plan.processes[0].argv[1:])}")
    lines.append("Service Configuration:")
    lines.append(json.dumps({p.name: p.config for p in plans}, indent=2, default=str))
    lines.append("Environment Variable that would be set:")
    lines.append(f"{CONFIG_ENV}={json.dumps(config)}")
    return "\n".join(lines)

"""``dynamo serve module:Service [-f config.yaml] [--Service.key=value ...]``: start a
service graph, one process per worker of every service, and supervise it; SIGHUP
restarts the service processes one at a time (rolling restart, docs/sdk.md)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from dynamo.sdk.cli.gpus import GpuAllocationError, allocation_disabled, detect_gpu_count
from dynamo.sdk.cli.plan import build_plan, check_config_names, describe, load_config, load_graph, working_dir_for
from dynamo.sdk.lib.config import ServiceConfigError
from dynamo.sdk.lib.overrides import load_deployment_config
from dynamo.supervisor import (
    DEFAULT_READY_TIMEOUT,
    READY_TIMEOUT_ENV,
    STOP_TIMEOUT_ENV,
    ChildSpec,
    Supervisor,
    seconds_from_env,
)


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # argparse keeps this type private
    parser = subparsers.add_parser(
        "serve",
        help="run a service graph locally",
        description="Start every service of the graph rooted at module:Service, one process per worker. "
        "Extra --Service.key=value arguments override the configuration (values are JSON when they parse).",
    )
    parser.add_argument("pipeline", help="module:Service (or path/file.py:Service)")
    parser.add_argument("-f", "--config-file", default=None, help="YAML configuration file")
    parser.add_argument("--service-name", default=os.environ.get("DYNAMO_SERVICE_NAME"),
                        help="start only this service of the graph")
    parser.add_argument("--working-dir", default=None, help="directory the module is imported from (default: .)")
    parser.add_argument("--depends", action="append", default=[], metavar="NAME=VALUE",
                        help="a service that already runs elsewhere: do not start it (repeatable)")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and configuration; start nothing")
    parser.set_defaults(handler=serve, accepts_overrides=True)



def serve(args: argparse.Namespace, extra: Sequence[str]) -> int:
    """Run ``dynamo serve``; returns the exit status."""
    working_dir = working_dir_for(args.pipeline, args.working_dir)
    try:
        # Unset: each child gets its own drain bound plus a margin (``stop_bound``).
        stop_timeout = seconds_from_env(STOP_TIMEOUT_ENV, None)
        ready_timeout = seconds_from_env(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT)
        deployed = load_deployment_config()
        file_config, overrides = load_config(None if deployed is not None else args.config_file, extra)
        if deployed is not None:
            file_config = deployed
        root, config = load_graph(args.pipeline, working_dir, file_config, overrides)
        graph = root.all_services()
        for warning in check_config_names(graph, file_config, overrides):
            print(f"warning: {warning}", file=sys.stderr)
        running = tuple(d.partition("=")[0] for d in args.depends)
        gpu_count = 0 if allocation_disabled() else detect_gpu_count()
        plans = build_plan(args.pipeline, root, config, working_dir, args.service_name, running, gpu_count)
    except (ServiceConfigError, GpuAllocationError, ValueError, ImportError, RuntimeError, TypeError) as exc:
        print(f"dynamo serve: error: {exc}", file=sys.stderr)
        return 2
    if args.dry_run:
        print(describe(plans, config))
        return 0
    children = [
        ChildSpec(p.label, p.argv, p.env, restart=s.restart, max_restarts=s.max_restarts, probe=p.probe)
        for s in plans
        for p in s.processes
    ]
    supervisor = Supervisor(
        children, name="dynamo serve", group="the graph", working_dir=working_dir, stop_timeout=stop_timeout,
        ready_timeout=ready_timeout,
    )
    return asyncio.run(supervisor.run())

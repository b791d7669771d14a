"""``python -m dynamo.planner --config planner.yaml [flags]``: run the planner's two loops
against a fleet until SIGINT/SIGTERM (docs/planner.md). Flags override the file; exit
status 2 for a bad configuration, 0 after a clean stop (the local connector's workers
drained)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from dynamo.planner.config import PlannerConfig, PlannerConfigError, load_config
from dynamo.planner.connector import ConnectorError, make_connector
from dynamo.planner.decide import Decider
from dynamo.planner.health import HealthServer
from dynamo.planner.loop import Planner
from dynamo.planner.observe import FrontendObserver, LoadReports
from dynamo.planner.profile import LiveCorrection, PerformanceModel, Profile, ProfileError, load_profile, model_for

log = logging.getLogger("dynamo.planner")

#: Flags that set one configuration key each (flag → dotted key).
FLAG_KEYS = {
    "model": "model",
    "frontend_metrics_url": "frontend_metrics_url",
    "ttft_ms": "targets.ttft.ms",
    "itl_ms": "targets.itl.ms",
    "gpu_budget": "gpu_budget",
    "throughput_interval": "intervals.throughput_s",
    "load_interval": "intervals.load_s",
    "profile": "profile",
    "port": "port",
}


def parse_args(argv: Sequence[str]) -> tuple[Path | None, dict[str, Any]]:
    """The configuration file and the overrides the flags give (dotted key → value)."""
    parser = argparse.ArgumentParser(prog="python -m dynamo.planner", description=__doc__)
    parser.add_argument("--config", type=Path, help="planner.yaml (see docs/planner.md)")
    parser.add_argument("--model", help="the model name the frontend serves")
    parser.add_argument("--frontend-metrics-url", help="the frontend's /metrics URL")
    parser.add_argument("--ttft-ms", type=float, help="TTFT target (ms) at its quantile")
    parser.add_argument("--itl-ms", type=float, help="ITL target (ms) at its quantile")
    parser.add_argument("--gpu-budget", type=float, help="most GPUs all roles may hold")
    parser.add_argument("--throughput-interval", type=float, help="seconds between throughput passes")
    parser.add_argument("--load-interval", type=float, help="seconds between load passes")
    parser.add_argument("--profile", help="a JSON profile (python -m dynamo.planner.profile)")
    parser.add_argument("--port", type=int, help="port of the planner's /health (0: a free one)")
    parser.add_argument("--advisory", action="store_true", default=None, help="decide and log, never act")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="any key by its dotted path, the value read as YAML (e.g. roles.agg.max_replicas=4); repeatable",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            parser.error(f"--set {item!r}: expected KEY=VALUE")
        overrides[key] = yaml.safe_load(value)
    for flag, key in FLAG_KEYS.items():
        value = getattr(args, flag)
        if value is not None:
            overrides[key] = value
    if args.advisory:
        overrides["advisory"] = True
    return args.config, overrides


def performance_model(config: PlannerConfig) -> PerformanceModel | None:
    """The model of ``config``'s profiles (``None``: none given): an aggregated worker's,
    or a prefill worker's and a decode worker's (``DisaggModel``), each role's own
    (``roles.<role>.profile``) or the top-level one.

    Raises:
        ProfileError: a profile is unusable, or was swept on a worker of another role.
    """
    paths = {name: role.profile or config.profile for name, role in config.roles.items()}
    if all(path is None for path in paths.values()):
        return None
    loaded: dict[Path, Profile] = {}
    profiles = {}
    for name, path in paths.items():
        assert path is not None  # the configuration holds a profile for every role or none
        if path not in loaded:  # the top-level profile serves every role without its own: read once
            loaded[path] = load_profile(path)
        profile = loaded[path]
        if profile.role not in ("agg", name):
            raise ProfileError(f"{path}: a {profile.role} worker's profile, given for role '{name}'")
        if profile.role != name and name != "agg":
            log.warning(
                "role '%s' is sized from an aggregated worker's profile (%s): a %s worker's own "
                "(python -m dynamo.planner.profile --role %s) sizes it closer", name, path, name, name,
            )
        profiles[name] = profile
    return model_for(profiles, LiveCorrection(config.warmup_s))


def build_planner(config: PlannerConfig, runtime: Any) -> Planner:
    """The planner of ``config``: its model, observers, connector and loops."""
    model = performance_model(config)
    frontend = FrontendObserver(
        config.frontend_metrics_url, config.model, config.stale_after_s,
        config.targets.ttft.quantile, config.targets.itl.quantile,
    )
    reports = {role: LoadReports(config.stale_after_s) for role in config.roles}
    return Planner(config, make_connector(config, runtime), frontend, Decider(config, model), reports)


async def _follow_reports(runtime: Any, config: PlannerConfig, planner: Planner) -> list[asyncio.Task[None]]:
    tasks = []
    for role, spec in config.roles.items():
        namespace, component, _ = spec.endpoint.removeprefix("dyn://").split(".", 2)
        subscription = await runtime.namespace(namespace).component(component).subscribe("load_metrics")
        tasks.append(asyncio.create_task(planner.reports[role].follow(subscription)))
    return tasks


async def run(config: PlannerConfig) -> int:
    """Run until SIGINT/SIGTERM; the exit status."""
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    runtime = DistributedRuntime(loop, False)
    followers: list[asyncio.Task[None]] = []
    health: HealthServer | None = None
    try:
        planner = build_planner(config, runtime)
        followers = await _follow_reports(runtime, config, planner)
        health = HealthServer(planner.health, port=config.port, metrics=planner.metrics)
        port = await health.start()
        log.info(
            "planner for model '%s': roles %s, connector %s%s; /health and /metrics on http://127.0.0.1:%d",
            config.model, ", ".join(config.roles), config.connector.kind,
            " (advisory)" if config.advisory else "", port,
        )
        try:
            await planner.run(stop)
        finally:
            log.info("stopping: closing the %s connector", config.connector.kind)
            await planner.connector.close()
    except (ProfileError, ConnectorError, ValueError) as e:
        log.error("%s", e)
        return 1
    finally:
        for task in followers:
            task.cancel()
        await asyncio.gather(*followers, return_exceptions=True)
        if health is not None:
            await health.close()
        await runtime.shutdown()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m dynamo.planner``; the exit status."""
    path, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="[planner] %(message)s", stream=sys.stderr)
    try:
        config = load_config(path, overrides)
    except PlannerConfigError as e:
        print(f"python -m dynamo.planner: {e}", file=sys.stderr)
        return 2
    return asyncio.run(run(config))


if __name__ == "__main__":
    sys.exit(main())

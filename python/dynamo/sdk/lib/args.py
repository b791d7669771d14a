"""One argument parser for a component, alone or under ``dynamo serve``.

A component's configuration comes from, lowest precedence first: the environment
``dynamo serve`` provides (``DYNAMO_SERVICE_CONFIG``), a YAML file (``-f``), and
command-line flags. ``--key value`` (or ``--key=value``) sets the component's own key;
``--Other.key=value`` sets another service's; ``--ServiceArgs.workers=2`` a nested one.
Options the component declares with ``add_argument`` are parsed by argparse as usual
and take their defaults from the configuration keys of the same name.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from dynamo.sdk.lib.config import ServiceConfig, load_from_env
from dynamo.sdk.lib.overrides import deep_merge, is_flag, load_config_file, parse_overrides


def split_declared(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into the options ``parser`` declares (with their values) and the rest."""
    declared: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        option = arg.split("=", 1)[0]
        action = parser._option_string_actions.get(option)  # argparse has no public lookup
        if action is None:
            i += 1
            if not arg.startswith("-"):
                declared.append(arg)  # a positional argument
                continue
            rest.append(arg)
            if "=" not in arg and i < len(argv) and not is_flag(argv[i]):
                rest.append(argv[i])  # the value of a configuration flag
                i += 1
            continue
        declared.append(arg)
        i += 1
        takes_value = action.nargs != 0 and "=" not in arg
        if takes_value and i < len(argv):
            declared.append(argv[i])
            i += 1
    return declared, rest


def load_component_config(
    service_name: str, argv: Sequence[str], config_file: str | None = None, known_services: Iterable[str] = ()
) -> dict[str, Any]:
    """The merged configuration of a component run with ``argv`` (flags that are not
    declared options); also installed as this process's ``ServiceConfig``."""
    config = load_from_env()
    if config_file:
        config = deep_merge(config, load_config_file(config_file))
    # `--Self.key=value` names this component itself, even when it knows no graph.
    known = [service_name, *(s for s in known_services if s != service_name)]
    overrides, leftover = parse_overrides(argv, default_service=service_name, known_services=known)
    if leftover:
        raise SystemExit(f"{service_name}: unexpected arguments {leftover}")
    config = deep_merge(config, overrides)
    ServiceConfig.set_instance(config)
    return config


class DynamoArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` for a component named ``service_name`` (see the module docstring)."""

    def __init__(self, service_name: str, *args: Any, known_services: Iterable[str] = (), **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service_name = service_name
        self.known_services = list(known_services)
        self.config: dict[str, Any] = {}
        self.add_argument("-f", "--config-file", default=None, help="YAML configuration file")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        argv = list(sys.argv[1:] if args is None else args)
        declared, rest = split_declared(self, argv)
        first, _ = super().parse_known_args(declared)
        self.config = load_component_config(self.service_name, rest, first.config_file, self.known_services)
        section = ServiceConfig(self.config).get_parsed_config(self.service_name)
        for action in self._actions:
            for key in (action.dest, action.dest.replace("_", "-")):
                if key in section:
                    action.default = section[key]
        return super().parse_args(declared, namespace)

"""Configuration sources and how they merge: a YAML (or JSON) file, ``--Service.key=value``
command-line overrides, and deep merging.

Precedence (highest first): command line, YAML file, ``@service`` decorator, constructor
defaults. This module handles the first two; ``dynamo.sdk.service`` applies the rest.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dynamo.sdk.lib.config import SERVICE_ARGS, ServiceConfigError

#: When set (YAML or JSON text), replaces the configuration file (deployments set it).
DEPLOYMENT_CONFIG_ENV = "DYN_DEPLOYMENT_CONFIG"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """A new dict: ``override`` merged into ``base`` key by key, recursing into dicts."""
    result = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A YAML (or JSON) configuration file as a dict; a clear error when unreadable or not a mapping."""
    file = Path(path)
    if not file.is_file():
        raise ServiceConfigError(f"configuration file {str(file)!r} does not exist")
    try:
        value = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ServiceConfigError(f"configuration file {str(file)!r} is not valid YAML: {exc}") from exc
    return _top_level_mapping(value, f"configuration file {str(file)!r}")


def load_deployment_config() -> dict[str, Any] | None:
    """The configuration in ``DYN_DEPLOYMENT_CONFIG`` (which replaces the file), if set."""
    raw = os.environ.get(DEPLOYMENT_CONFIG_ENV)
    if not raw:
        return None
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ServiceConfigError(f"{DEPLOYMENT_CONFIG_ENV} is not valid YAML/JSON: {exc}") from exc
    return _top_level_mapping(value, DEPLOYMENT_CONFIG_ENV)


def _top_level_mapping(value: Any, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ServiceConfigError(f"{what} must map service names to settings, got {type(value).__name__}")
    for service, section in value.items():
        if section is not None and not isinstance(section, dict):
            raise ServiceConfigError(f"{what}: the section of {service!r} must be a mapping, got {section!r}")
    return {service: section or {} for service, section in value.items()}


def parse_value(text: str, keep_string: bool = False) -> Any:
    """A command-line value: JSON when it parses (numbers, booleans, lists, objects,
    quoted strings), otherwise the text itself."""
    if keep_string:
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def _nest(path: Sequence[str], value: Any) -> dict[str, Any]:
    result: Any = value
    for key in reversed(path):
        result = {key: result}
    return result


def is_flag(arg: str) -> bool:
    """Whether ``arg`` starts a new option (``--x``), as opposed to a value such as ``-1``."""
    if not arg.startswith("-"):
        return False
    try:
        float(arg)
        return False
    except ValueError:
        return True


def parse_overrides(
    args: Iterable[str],
    default_service: str | None = None,
    known_services: Iterable[str] = (),
) -> tuple[dict[str, Any], list[str]]:
    """Parse ``--Service.key=value`` / ``--Service.key value`` overrides (any depth:
    ``--Service.ServiceArgs.workers=4``) into a nested dict, deep-merged in order.

    With ``default_service`` (a component run on its own), ``--key value`` and dotted
    paths whose first part is not in ``known_services`` belong to that service. A flag
    with no value is ``true``. Values under ``ServiceArgs.envs`` stay strings.

    Returns the overrides and the arguments that are not overrides.
    """
    services = set(known_services)
    overrides: dict[str, Any] = {}
    leftover: list[str] = []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            leftover.append(arg)
            continue
        name, eq, raw = arg[2:].partition("=")
        path = name.split(".")
        if any(not p for p in path):
            raise ServiceConfigError(f"malformed option {arg!r}: empty key in {name!r}")
        if len(path) == 1 and default_service is None:
            leftover.append(arg)
            continue
        if default_service is not None and (len(path) == 1 or path[0] not in services):
            path = [default_service, *path]
        if not eq:
            if i < len(items) and not is_flag(items[i]):
                raw = items[i]
                i += 1
            else:
                raw = "true"
        keep_string = len(path) >= 4 and path[1] == SERVICE_ARGS and path[2] == "envs"
        overrides = deep_merge(overrides, _nest(path, parse_value(raw, keep_string)))
    return overrides, leftover


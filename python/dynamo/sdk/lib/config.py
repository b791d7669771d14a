"""``ServiceConfig``: the merged configuration every service process reads.

``dynamo serve`` (and a standalone run) resolves the YAML file and the command-line
overrides into one JSON object and hands it to each process in the
``DYNAMO_SERVICE_CONFIG`` environment variable. Its shape::

    {
      "Common": {"block-size": 64, ...},            # optional shared section
      "MyService": {
        "ServiceArgs": {"workers": 2, "resources": {"gpu": 1}, "dynamo": {...}},
        "common-configs": ["block-size"],          # keys taken from Common
        "model_name": "...", ...                   # the service's own keys
      }
    }
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable
from typing import Any, ClassVar, Generic, TypeVar

#: The environment variable that carries the merged configuration.
CONFIG_ENV = "DYNAMO_SERVICE_CONFIG"
#: The section with keys shared by several services.
COMMON_SECTION = "Common"
#: The per-service list of keys a service takes from ``Common``.
COMMON_KEYS = "common-configs"
#: The per-service section that overrides the ``@service`` decorator.
SERVICE_ARGS = "ServiceArgs"


R = TypeVar("R")


class _on_instance_or_class(Generic[R]):
    """A method callable on an instance, or on the class for the process's instance
    (``ServiceConfig.get_parsed_config("Frontend")``, as the reference's components call it)."""

    def __init__(self, func: Callable[..., R]) -> None:
        self.func = func
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __get__(self, instance: Any, owner: Any) -> Callable[..., R]:
        target = instance if instance is not None else owner.get_instance()
        return functools.partial(self.func, target)


class ServiceConfigError(ValueError):
    """A configuration value is missing, malformed or of the wrong type."""


class ServiceConfig(dict[str, Any]):
    """The configuration of every service, keyed by service name (a process-wide singleton)."""

    _instance: ClassVar[ServiceConfig | None] = None

    @classmethod
    def get_instance(cls) -> ServiceConfig:
        """The configuration of this process, read from ``DYNAMO_SERVICE_CONFIG`` on first use."""
        if cls._instance is None:
            cls._instance = cls(load_from_env())
        return cls._instance

    @classmethod
    def set_instance(cls, config: dict[str, Any]) -> ServiceConfig:
        """Replace this process's configuration (the runner does this after parsing flags)."""
        cls._instance = cls(config)
        return cls._instance

    @classmethod
    def reset(cls) -> None:
        """Forget the loaded configuration (the next ``get_instance`` reads the environment again)."""
        cls._instance = None

    def require(self, service_name: str, key: str) -> Any:
        """The value of ``key`` for ``service_name``; a clear error naming both when it is missing."""
        section = self.get(service_name)
        if not isinstance(section, dict) or key not in section:
            raise ServiceConfigError(
                f"{service_name}.{key} must be specified in configuration (YAML '{service_name}: {{{key}: ...}}' "
                f"or --{service_name}.{key}=...)"
            )
        return section[key]

    @_on_instance_or_class
    def get_parsed_config(self, service_name: str) -> dict[str, Any]:
        """The service's own keys: its section without ``ServiceArgs`` and
        ``common-configs``, plus the ``Common`` keys it subscribes to (its own value wins).
        Callable on the class too (``ServiceConfig.get_parsed_config("Frontend")``), for
        this process's configuration."""
        section = self.get(service_name) or {}
        if not isinstance(section, dict):
            raise ServiceConfigError(f"the configuration of {service_name} must be a mapping, got {section!r}")
        result: dict[str, Any] = {}
        common = self.get(COMMON_SECTION) or {}
        subscribed = section.get(COMMON_KEYS) or []
        if not isinstance(subscribed, list):
            raise ServiceConfigError(f"{service_name}.{COMMON_KEYS} must be a list of keys, got {subscribed!r}")
        for key in subscribed:
            if key in common:
                result[key] = common[key]
        for key, value in section.items():
            if key not in (SERVICE_ARGS, COMMON_KEYS):
                result[key] = value
        return result

    def as_args(self, service_name: str, prefix: str = "") -> list[str]:
        """The service's keys as command-line arguments for another parser.

        Only keys starting with ``prefix`` are taken (the prefix is removed). ``True``
        becomes a bare ``--flag``, ``False`` and ``None`` are left out, dicts and lists are
        passed as JSON, anything else as ``str(value)``.
        """
        args: list[str] = []
        for key, value in self.get_parsed_config(service_name).items():
            if not key.startswith(prefix):
                continue
            flag = f"--{key[len(prefix):]}"
            if value is True:
                args.append(flag)
            elif value is False or value is None:
                continue
            elif isinstance(value, (dict, list)):
                args.extend([flag, json.dumps(value)])
            else:
                args.extend([flag, str(value)])
        return args


def load_from_env() -> dict[str, Any]:
    """The configuration in ``DYNAMO_SERVICE_CONFIG`` (empty when unset); malformed JSON is an error."""
    raw = os.environ.get(CONFIG_ENV)
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ServiceConfigError(f"{CONFIG_ENV} is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ServiceConfigError(f"{CONFIG_ENV} must hold a JSON object, got {type(value).__name__}")
    return value

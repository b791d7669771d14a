"""Lifecycle decorators. They only mark methods; the runner calls them.

- ``@async_on_start``: awaited after the instance is built, before endpoints are served.
- ``@async_on_shutdown`` / ``@on_shutdown``: called (awaited if async) once the process
  stops serving, on SIGTERM/SIGINT or when the runtime shuts down.
- ``@liveness`` / ``@readiness``: a method returning a bool (sync or async) that answers
  ``GET /healthz`` / ``GET /readyz`` on the service's web app.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

START_HOOK = "__dynamo_startup_hook__"
SHUTDOWN_HOOK = "__dynamo_shutdown_hook__"
LIVENESS = "__dynamo_liveness__"
READINESS = "__dynamo_readiness__"


def _mark(attribute: str) -> Callable[[F], F]:
    def decorator(func: F) -> F:
        setattr(func, attribute, True)
        return func

    return decorator


def async_on_start(func: F) -> F:
    """Run this method (awaited) after the service instance is built, before it serves."""
    return _mark(START_HOOK)(func)


def async_on_shutdown(func: F) -> F:
    """Run this method (awaited) when the service stops."""
    return _mark(SHUTDOWN_HOOK)(func)


def on_shutdown(func: F) -> F:
    """Run this method (sync or async) when the service stops."""
    return _mark(SHUTDOWN_HOOK)(func)


def liveness(func: F) -> F:
    """This method answers ``GET /healthz``: truthy → 200, falsy → 503, raising → 500."""
    return _mark(LIVENESS)(func)


def readiness(func: F) -> F:
    """This method answers ``GET /readyz``: truthy → 200, falsy → 503, raising → 500."""
    return _mark(READINESS)(func)


def marked(cls: type, attribute: str) -> list[str]:
    """Names of the methods of ``cls`` (and its bases) carrying ``attribute``, base classes first."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            if getattr(value, attribute, False) and name not in names:
                names.append(name)
    return [n for n in names if getattr(getattr(cls, n, None), attribute, False)]

"""Endpoint decorators: ``@endpoint()`` (alias ``@dynamo_endpoint()``) serves a method on
the Dynamo runtime; ``@api()`` serves it as an HTTP ``POST /<name>`` route on the
service's own web app; ``@abstract_endpoint`` declares one in an ``AbstractService``.

The decorators only record an ``EndpointSpec`` on the function; the runner serves it.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, overload

from dynamo.runtime._handler import handler_shape, parse_request

F = TypeVar("F", bound=Callable[..., Any])

SPEC_ATTRIBUTE = "__dynamo_endpoint__"
ABSTRACT_ATTRIBUTE = "__dynamo_abstract_endpoint__"

Transport = Literal["dynamo", "http"]


@dataclass(frozen=True)
class EndpointSpec:
    """What ``@endpoint``/``@api`` recorded about a method."""

    name: str
    method: str
    transport: Transport
    request_type: Any
    takes_context: bool
    options: dict[str, Any]

    def parse_request(self, value: Any) -> Any:
        """The request as the handler expects it: a pydantic model is validated from a dict,
        a JSON string or an instance; anything else is passed through."""
        return parse_request(self.request_type, value, self.name)


def _decorate(name: str | None, transport: Transport, options: dict[str, Any]) -> Callable[[F], F]:
    def decorator(func: F) -> F:
        if not callable(func):
            raise TypeError(f"@endpoint/@api decorate a method, got {func!r}")
        shape = handler_shape(func)
        spec = EndpointSpec(
            name=name or func.__name__,
            method=func.__name__,
            transport=transport,
            request_type=shape.request_type,
            takes_context=shape.takes_context,
            options=options,
        )
        setattr(func, SPEC_ATTRIBUTE, spec)
        return func

    return decorator


@overload
def endpoint(name: F, /) -> F: ...
@overload
def endpoint(name: str | None = None, /, **options: Any) -> Callable[[F], F]: ...
def endpoint(name: Any = None, /, **options: Any) -> Any:
    """Serve the decorated method as a Dynamo endpoint named ``name`` (default: the method
    name). The request is parsed into the type of the method's first parameter when that
    is a pydantic model; an optional second parameter receives the request context."""
    if callable(name):
        return _decorate(None, "dynamo", {})(name)
    return _decorate(name, "dynamo", options)


#: The seeds' other spelling of ``endpoint``.
dynamo_endpoint = endpoint


@overload
def api(name: F, /) -> F: ...
@overload
def api(name: str | None = None, /, **options: Any) -> Callable[[F], F]: ...
def api(name: Any = None, /, **options: Any) -> Any:
    """Serve the decorated method as ``POST /<name>`` on the service's web app (FastAPI).
    A generator method streams its items (``media_type`` option, default
    ``text/event-stream``); a returned Starlette ``Response`` is sent as it is; other
    values are JSON; an exception is a 500 with its message (``HTTPException`` keeps its
    status)."""
    if callable(name):
        return _decorate(None, "http", {})(name)
    return _decorate(name, "http", options)


def abstract_endpoint(func: F) -> F:
    """Declare an endpoint that every service implementing this interface must provide,
    decorated with ``@endpoint``."""
    setattr(func, ABSTRACT_ATTRIBUTE, True)
    return abc.abstractmethod(func)


class AbstractService(abc.ABC):  # noqa: B024 - the abstract methods come from subclasses
    """Base of service interfaces: ``depends(Interface)`` is resolved with ``.link()``."""


def endpoint_specs(cls: type) -> dict[str, EndpointSpec]:
    """The endpoints of ``cls`` (including inherited ones), by endpoint name."""
    found: dict[str, EndpointSpec] = {}
    for attr in dir(cls):
        spec = getattr(getattr(cls, attr, None), SPEC_ATTRIBUTE, None)
        if isinstance(spec, EndpointSpec):
            if spec.name in found and found[spec.name].method != spec.method:
                raise TypeError(f"{cls.__name__}: two methods serve the endpoint '{spec.name}'")
            found[spec.name] = spec
    return found


def check_abstract_endpoints(cls: type) -> None:
    """Fail when ``cls`` leaves an abstract endpoint of its interfaces unimplemented or
    implements it without ``@endpoint``."""
    missing: list[str] = []
    undecorated: list[str] = []
    for base in cls.__mro__[1:]:
        for name, value in vars(base).items():
            if not getattr(value, ABSTRACT_ATTRIBUTE, False):
                continue
            impl = getattr(cls, name, None)
            if impl is None or getattr(impl, ABSTRACT_ATTRIBUTE, False):
                missing.append(name)
            elif not isinstance(getattr(impl, SPEC_ATTRIBUTE, None), EndpointSpec):
                undecorated.append(name)
    problems = []
    if missing:
        problems.append(f"does not implement {sorted(set(missing))}")
    if undecorated:
        problems.append(f"implements {sorted(set(undecorated))} without @endpoint()")
    if problems:
        raise TypeError(f"service {cls.__name__} " + " and ".join(problems) + " of its interface")

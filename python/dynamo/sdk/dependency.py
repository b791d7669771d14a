"""``depends()``: an edge of the service graph and, on an instance, a client.

``service_b = depends(ServiceB)`` as a class attribute records the edge (``dynamo serve``
starts ServiceB too). On an instance, ``self.service_b`` is a ``DependencyClient`` whose
attributes are ServiceB's endpoints::

    async for item in self.service_b.generate(request): ...   # the stream's items
    result = await self.service_b.preprocess(request)          # the one item (or a list)

The target can be a ``@service`` class, an ``AbstractService`` interface (resolved with
``Service.link(Implementation)``) or a ``BaseDeployment`` (a component with its own
``main``).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Generator
from typing import TYPE_CHECKING, Any

from dynamo.sdk.context import dynamo_context

if TYPE_CHECKING:
    from dynamo.runtime import Client

#: Seconds a call waits for the dependency's first instance before failing.
WAIT_ENV = "DYN_SDK_DEPENDENCY_TIMEOUT"
DEFAULT_WAIT = 60.0


class Dependency:
    """The class attribute ``depends()`` returns (a descriptor)."""

    def __init__(self, on: Any) -> None:
        self.on = on
        self.attr: str | None = None
        self.owner: type | None = None

    def __set_name__(self, owner: type, name: str) -> None:
        self.attr = name
        self.owner = owner

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        cache = instance.__dict__.setdefault("__dynamo_clients__", {})
        client = cache.get(self.attr)
        if client is None:
            client = cache[self.attr] = DependencyClient(self)
        return client

    @property
    def target_name(self) -> str:
        return getattr(self.on, "name", None) or getattr(self.on, "__name__", repr(self.on))

    def address(self) -> tuple[str, str]:
        """(namespace, component) of the target."""
        address = getattr(self.on, "dynamo_address", None)
        if address is None:
            raise RuntimeError(
                f"{self.owner.__name__ if self.owner else '?'}.{self.attr} depends on the interface "
                f"{self.target_name}; choose an implementation with .link(<Service>) before serving"
            )
        return address()

    def endpoint_names(self) -> list[str] | None:
        """The target's endpoint names, or None when unknown (a BaseDeployment)."""
        names = getattr(self.on, "endpoint_names", None)
        return names() if callable(names) else None

    def __repr__(self) -> str:
        return f"depends({self.target_name})"


def depends(on: Any = None, **_options: Any) -> Any:
    """Declare that this service uses ``on`` (see the module docstring)."""
    if on is None:
        raise TypeError("depends() needs the service it depends on")
    return Dependency(on)


class DependencyClient:
    """What ``self.<dependency>`` is on a running instance: one attribute per endpoint."""

    def __init__(self, dependency: Dependency) -> None:
        self._dependency = dependency
        self._clients: dict[str, Client] = {}
        self._lock = asyncio.Lock()

    def __getattr__(self, name: str) -> EndpointCaller:
        if name.startswith("_"):
            raise AttributeError(name)
        names = self._dependency.endpoint_names()
        if names is not None and name not in names:
            raise AttributeError(
                f"{self._dependency.target_name} has no endpoint '{name}' (its endpoints: {sorted(names)})"
            )
        return EndpointCaller(self, name)

    async def client(self, endpoint: str) -> Client:
        """The runtime client of one endpoint of the target, created once."""
        client = self._clients.get(endpoint)
        if client is not None:
            return client
        async with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                runtime = dynamo_context.get("runtime")
                if runtime is None:
                    raise RuntimeError(
                        "no Dynamo runtime in this process: dependencies are available inside a service "
                        "run by `dynamo serve` or `python -m dynamo.sdk.run`"
                    )
                namespace, component = self._dependency.address()
                client = await runtime.namespace(namespace).component(component).endpoint(endpoint).client()
                self._clients[endpoint] = client
        return client

    def __repr__(self) -> str:
        return f"<client of {self._dependency.target_name}>"


class EndpointCaller:
    """``self.dep.<endpoint>``: call it with the request."""

    def __init__(self, owner: DependencyClient, endpoint: str) -> None:
        self._owner = owner
        self._endpoint = endpoint

    def __call__(self, *args: Any, **kwargs: Any) -> DependencyCall:
        if len(args) > 1 or (args and kwargs):
            raise TypeError(f"{self._endpoint}() takes one request (or keyword fields of one), got {args!r} {kwargs!r}")
        request = args[0] if args else kwargs
        return DependencyCall(self._owner, self._endpoint, request)


class DependencyCall:
    """One request to a dependency: iterate it for the items, or await it for the result."""

    def __init__(self, owner: DependencyClient, endpoint: str, request: Any) -> None:
        self._owner = owner
        self._endpoint = endpoint
        self._request = request

    async def _items(self) -> AsyncIterator[Any]:
        client = await self._owner.client(self._endpoint)
        if not client.instance_ids():
            timeout = float(os.environ.get(WAIT_ENV, DEFAULT_WAIT))
            await client.wait_for_instances(timeout)
        stream = await client.generate(self._request)
        async for item in stream:
            yield item.data()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._items()

    async def _collect(self) -> Any:
        items = [item async for item in self._items()]
        if not items:
            return None
        return items[0] if len(items) == 1 else items

    def __await__(self) -> Generator[Any, None, Any]:
        return self._collect().__await__()

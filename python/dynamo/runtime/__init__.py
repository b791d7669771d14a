"""The low-level runtime API: ``DistributedRuntime`` → namespace → component → endpoint.

```python
@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    endpoint = runtime.namespace("ns").component("backend").endpoint("generate")
    await endpoint.serve_endpoint(handler)
```
"""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from dynamo._core import (
    Annotated,
    Client,
    Component,
    ConfigError,
    DistributedRuntime,
    DynamoError,
    DynamoTimeoutError,
    Endpoint,
    HandlerError,
    InstanceNotFoundError,
    KeyValueStore,
    Namespace,
    NoInstancesError,
    PayloadTooLargeError,
    RequestContext,
    ResponseStream,
    StreamDisconnectedError,
    Subscription,
)
from dynamo.runtime._handler import as_stream, check_item, handler_shape, parse_request
from dynamo.runtime.kv_cache import EtcdKvCache

__all__ = [
    "Annotated",
    "Client",
    "Component",
    "ConfigError",
    "DistributedRuntime",
    "DynamoError",
    "DynamoTimeoutError",
    "Endpoint",
    "EtcdKvCache",
    "HandlerError",
    "InstanceNotFoundError",
    "KeyValueStore",
    "Namespace",
    "NoInstancesError",
    "PayloadTooLargeError",
    "RequestContext",
    "ResponseStream",
    "StreamDisconnectedError",
    "Subscription",
    "WorkerUnavailableError",
    "dynamo_endpoint",
    "dynamo_worker",
]

logger = logging.getLogger("dynamo.runtime")


class WorkerUnavailableError(StreamDisconnectedError):
    """Raised by an endpoint handler whose worker can no longer serve the stream (its
    engine died): the caller's stream fails as unavailable, as if the worker had died,
    so a frontend continues it on another worker where the model's migration limit
    allows. Any other exception ends the stream with the handler's error."""


F = TypeVar("F", bound=Callable[..., Any])


def dynamo_worker(static: bool = False) -> Callable[[Callable[..., Awaitable[Any]]], Callable[..., Awaitable[Any]]]:
    """Decorate ``async def worker(runtime, *args)``: calling it builds a runtime from the
    environment on the running loop, turns SIGINT/SIGTERM into graceful shutdown, runs
    the function, and shuts the runtime down when it returns or raises.

    ``static`` is accepted for compatibility with older scripts and changes nothing.
    """

    def decorator(func: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(func)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            loop = asyncio.get_running_loop()
            runtime = DistributedRuntime(loop, static)
            installed = []
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, _on_signal, runtime, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass  # not the main thread, or a platform without signals
            try:
                return await func(runtime, *args, **kwargs)
            finally:
                await runtime.shutdown()
                for sig in installed:
                    loop.remove_signal_handler(sig)

        return wrapper

    return decorator


def _on_signal(runtime: DistributedRuntime, sig: signal.Signals) -> None:
    logger.info("received %s; shutting down gracefully", sig.name)
    runtime.shutdown()


def dynamo_endpoint(
    request_model: type | None = None, response_model: type | None = None
) -> Callable[[F], F]:
    """Validate requests into ``request_model`` (a pydantic model) before the handler
    sees them, and items against ``response_model`` before they are sent. An item that is
    already JSON text (``Response(...).model_dump_json()``, as the reference's examples
    yield) is checked against ``response_model`` and sent unchanged.

    Works on functions and methods whose last positional argument before an optional
    context is the request.
    """

    def decorator(func: F) -> F:
        index = 1 if handler_shape(func).is_method else 0

        @functools.wraps(func)
        async def wrapper(*args: Any) -> AsyncIterator[Any]:
            args_list = list(args)
            args_list[index] = parse_request(request_model, args_list[index])
            async for item in await as_stream(func(*args_list)):
                yield check_item(response_model, item)

        return wrapper  # type: ignore[return-value]

    return decorator

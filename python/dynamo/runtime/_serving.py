"""Runs a Python endpoint handler for each request the runtime hands to the loop.

The Rust side queues requests and calls ``dispatch(request, context, sink)`` on the
event loop thread; each request runs in its own task and writes items to ``sink``.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from dynamo._core import StreamDisconnectedError

logger = logging.getLogger("dynamo.runtime")


def _takes_context(handler: Callable[..., Any]) -> bool:
    """Whether ``handler`` accepts a second positional argument (the context)."""
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [
        p
        for p in params
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return len(positional) >= 2


def make_dispatcher(handler: Callable[..., Any]) -> Callable[[Any, Any, Any], None]:
    """Build the function the runtime calls for each request of one endpoint."""
    if not callable(handler):
        raise TypeError(f"endpoint handler must be callable, got {handler!r}")
    with_context = _takes_context(handler)
    loop = asyncio.get_running_loop()

    def dispatch(request: Any, context: Any, sink: Any) -> None:
        task = loop.create_task(_run(handler, with_context, request, context, sink))
        context._attach_task(task)

    return dispatch


async def _run(handler: Callable[..., Any], with_context: bool, request: Any, context: Any, sink: Any) -> None:
    stream: Any = None
    try:
        result = handler(request, context) if with_context else handler(request)
        if inspect.isawaitable(result) and not hasattr(result, "__aiter__"):
            result = await result
            if not hasattr(result, "__aiter__"):
                # A coroutine handler: its return value is the one item.
                if result is not None:
                    sink.send(result)
                sink.finish()
                return
        stream = result
        async for item in stream:
            if sink.send(item):
                continue
            if sink.closed:
                return
            await sink.flush()
        sink.finish()
    except asyncio.CancelledError:
        # The caller killed the stream (or the loop is closing): nobody reads it.
        return
    except StreamDisconnectedError as exc:
        # This worker cannot serve the stream any more (WorkerUnavailableError): the
        # caller sees it fail as a worker that died would, and may migrate it.
        sink.unavailable(str(exc))
    except Exception as exc:
        logger.debug("handler failed", exc_info=True)
        sink.error(f"{type(exc).__name__}: {exc}")
    finally:
        aclose = getattr(stream, "aclose", None)
        if aclose is not None:
            try:
                await aclose()
            except Exception:
                logger.debug("closing the handler's generator failed", exc_info=True)


async def as_coroutine(awaitable: Any) -> Any:
    """Wrap a future-like awaitable so ``asyncio.create_task`` accepts it."""
    return await awaitable

"""Runs a Python endpoint handler for each request the runtime hands to the loop.

The Rust side queues requests and calls ``dispatch(request, context, sink)`` on the
event loop thread; each request runs in its own task and writes items to ``sink``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from dynamo._core import StreamDisconnectedError
from dynamo.runtime._handler import as_stream, handler_shape

logger = logging.getLogger("dynamo.runtime")


def make_dispatcher(handler: Callable[..., Any]) -> Callable[[Any, Any, Any], None]:
    """Build the function the runtime calls for each request of one endpoint."""
    if not callable(handler):
        raise TypeError(f"endpoint handler must be callable, got {handler!r}")
    with_context = handler_shape(handler).takes_context
    loop = asyncio.get_running_loop()

    def dispatch(request: Any, context: Any, sink: Any) -> None:
        task = loop.create_task(_run(handler, with_context, request, context, sink))
        context._attach_task(task)

    return dispatch


async def _run(handler: Callable[..., Any], with_context: bool, request: Any, context: Any, sink: Any) -> None:
    stream: Any = None
    try:
        stream = await as_stream(handler(request, context) if with_context else handler(request))
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

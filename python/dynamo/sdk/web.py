"""The service's own web app: ``@api`` routes and the liveness/readiness probes,
served by uvicorn inside the service process."""

from __future__ import annotations

import contextlib
import inspect
import itertools
import json
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from dynamo.runtime._handler import as_text
from dynamo.sdk.endpoint import EndpointSpec
from dynamo.sdk.hooks import LIVENESS, READINESS, marked

logger = logging.getLogger("dynamo.sdk")


def build_app(app: Any, instance: Any, specs: dict[str, EndpointSpec]) -> Any:
    """``app`` (or a new FastAPI app) with a ``POST /<name>`` route per ``@api`` endpoint
    and ``/healthz`` / ``/readyz`` when the class marks probe methods."""
    from fastapi import FastAPI

    app = app if app is not None else FastAPI()
    for spec in specs.values():
        app.add_api_route(f"/{spec.name}", _route(instance, spec), methods=["POST"], name=spec.name)
    cls = type(instance)
    for attribute, path in ((LIVENESS, "/healthz"), (READINESS, "/readyz")):
        for name in marked(cls, attribute)[:1]:
            app.add_api_route(path, _probe(getattr(instance, name)), methods=["GET"])
    return app


def _route(instance: Any, spec: EndpointSpec) -> Callable[..., Any]:
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    method = getattr(instance, spec.method)
    media_type = spec.options.get("media_type", "text/event-stream")

    async def route(request: Request) -> Any:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else {}
            parsed = spec.parse_request(body)
        except (ValueError, json.JSONDecodeError) as exc:
            return JSONResponse({"detail": str(exc)}, status_code=422)
        try:
            result = method(parsed)
            if inspect.isawaitable(result):
                result = await result
            return await _respond(result, media_type)
        except HTTPException:
            raise  # FastAPI answers it with its own status and detail
        except Exception as exc:
            logger.exception("@api %s failed", spec.name)
            return JSONResponse({"detail": f"{type(exc).__name__}: {exc}"}, status_code=500)

    route.__annotations__["request"] = Request  # FastAPI reads it; the string form would not resolve here
    return route


async def _respond(result: Any, media_type: str) -> Any:
    """The HTTP response for what a handler returned. A ``Response`` is sent as it is; a
    generator streams, its first item pulled here so that an exception before it is
    still a 500; anything else is JSON."""
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool
    from starlette.responses import Response

    if isinstance(result, Response):
        return result
    if inspect.isasyncgen(result):
        try:
            first = await anext(result)
        except StopAsyncIteration:
            return StreamingResponse(iter(()), media_type=media_type)
        return StreamingResponse(_texts(first, result), media_type=media_type)
    if inspect.isgenerator(result):
        first = await run_in_threadpool(next, result, _END)
        if first is _END:
            return StreamingResponse(iter(()), media_type=media_type)
        return StreamingResponse((as_text(x) for x in itertools.chain((first,), result)), media_type=media_type)
    if hasattr(result, "model_dump"):
        result = result.model_dump(mode="json")
    return JSONResponse(result)


#: Marks a sync generator's end (``next``'s default).
_END = object()


async def _texts(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[str | bytes]:
    yield as_text(first)
    async for item in rest:
        yield as_text(item)


def _probe(check: Callable[[], Any]) -> Callable[..., Any]:
    from fastapi.responses import JSONResponse

    async def probe() -> Any:
        try:
            ok = check()
            if inspect.isawaitable(ok):
                ok = await ok
        except Exception as exc:
            return JSONResponse({"status": "error", "detail": f"{type(exc).__name__}: {exc}"}, status_code=500)
        return JSONResponse({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    return probe


def listen(host: str, port: int) -> socket.socket:
    """A listening socket that the service's other processes can share (SO_REUSEPORT)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


class WebServer:
    """uvicorn serving one app on a given socket; signals stay with the runner."""

    def __init__(self, app: Any, sock: socket.socket) -> None:
        import uvicorn

        class _Server(uvicorn.Server):
            @contextlib.contextmanager
            def capture_signals(self) -> Iterator[None]:  # the runner owns SIGINT/SIGTERM
                yield

        self.sock = sock
        self.server = _Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))

    async def serve(self) -> None:
        await self.server.serve(sockets=[self.sock])

    def stop(self) -> None:
        self.server.should_exit = True

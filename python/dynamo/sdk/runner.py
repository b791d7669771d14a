"""Run one process of a service: build the runtime and the instance, serve its endpoints
(and web app), and on SIGTERM/SIGINT drain, run the shutdown hooks and exit."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dynamo.runtime._handler import as_stream
from dynamo.sdk.context import dynamo_context
from dynamo.sdk.endpoint import EndpointSpec
from dynamo.sdk.hooks import LIVENESS, READINESS, SHUTDOWN_HOOK, START_HOOK, marked
from dynamo.sdk.lib.config import ServiceConfig
from dynamo.sdk.service import DynamoService

logger = logging.getLogger("dynamo.sdk")

#: Index of this process among its service's processes (set by ``dynamo serve``).
WORKER_INDEX_ENV = "DYN_SDK_WORKER_INDEX"
#: Port and host of a service's web app unless its configuration sets ``port``/``host``.
PORT_ENV, HOST_ENV = "DYNAMO_PORT", "DYNAMO_HOST"
DEFAULT_PORT, DEFAULT_HOST = 8000, "0.0.0.0"
#: The system server's settings (``dynamo serve`` gives each process a port of its own).
SYSTEM_SERVER_ENV = ("DYN_SYSTEM_ENABLED", "DYN_SYSTEM_HOST", "DYN_SYSTEM_PORT", "DYN_SYSTEM_PORT_FILE")
#: Seconds the shutdown hooks may take.
HOOK_TIMEOUT = 30.0


def make_handler(instance: Any, spec: EndpointSpec) -> Callable[..., Awaitable[AsyncIterator[Any]]]:
    """The runtime handler of one endpoint: parse the request, call the method, and return
    its items as a stream (``dynamo.runtime._handler.as_stream``)."""
    method = getattr(instance, spec.method)
    if spec.takes_context:

        async def with_context(request: Any, context: Any) -> AsyncIterator[Any]:
            return await as_stream(method(spec.parse_request(request), context))

        return with_context

    async def without_context(request: Any) -> AsyncIterator[Any]:
        return await as_stream(method(spec.parse_request(request)))

    return without_context


async def _call_hooks(instance: Any, attribute: str) -> None:
    for name in marked(type(instance), attribute):
        result = getattr(instance, name)()
        if inspect.isawaitable(result):
            await result


def _needs_web_app(service: DynamoService) -> bool:
    cls = service.inner
    return bool(service.endpoints("http")) or service.app is not None or bool(
        marked(cls, LIVENESS) or marked(cls, READINESS)
    )


async def serve_service(service: DynamoService) -> int:
    """Serve ``service`` in this process until SIGTERM/SIGINT or the runtime shuts down.
    Returns the process exit status."""
    from dynamo.runtime import DistributedRuntime

    loop = asyncio.get_running_loop()
    config = ServiceConfig.get_instance()
    args = service.service_args(config)
    for key, value in args.envs.items():  # `dynamo serve` set them already; a standalone run did not
        os.environ.setdefault(key, value)
    kwargs = service.constructor_kwargs(config)  # a bad type fails before anything starts

    runtime = DistributedRuntime(loop, False)
    # The system server's settings belong to this process (its runtime has read them): a
    # process the service starts (an HTTP frontend, an engine) must not try the same port.
    for key in SYSTEM_SERVER_ENV:
        os.environ.pop(key, None)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    namespace = args.dynamo.namespace
    component = runtime.namespace(namespace).component(service.name)
    specs = service.endpoints("dynamo")
    endpoints = {name: component.endpoint(name) for name in specs}
    dynamo_context.update(
        runtime=runtime,
        namespace=namespace,
        component=component,
        service_name=service.name,
        worker_id=runtime.instance_id(),
        worker_index=int(os.environ.get(WORKER_INDEX_ENV, "0")),
        endpoints=list(endpoints.values()),
    )

    instance: Any = None
    tasks: list[asyncio.Task[Any]] = []
    web = None
    status = 0
    try:
        instance = service(**kwargs)
        await _call_hooks(instance, START_HOOK)
        for name, spec in specs.items():
            tasks.append(loop.create_task(endpoints[name].serve_endpoint(make_handler(instance, spec)), name=name))
        if _needs_web_app(service):
            web = _start_web(service, instance, config)
            tasks.append(loop.create_task(web.serve(), name="web"))
        if not specs:
            # No endpoint to register: ready (the system server's /ready) once it serves.
            runtime.set_ready(True)
        logger.info("%s serving %s in namespace %s", service.name, sorted(specs) or "(no endpoints)", namespace)
        print(f"{service.name} ready", flush=True)
        stopper = loop.create_task(stop.wait())
        done, _ = await asyncio.wait([*tasks, stopper, loop.create_task(runtime.closed())],
                                     return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and not task.cancelled() and task.exception() is not None:
                logger.error("%s: %s failed: %s", service.name, task.get_name(), task.exception())
                status = 1
    finally:
        if web is not None:
            web.stop()
        await runtime.shutdown()  # stop taking requests, drain in-flight streams, deregister
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if instance is not None:
            try:
                await asyncio.wait_for(_call_hooks(instance, SHUTDOWN_HOOK), HOOK_TIMEOUT)
            except Exception:
                logger.exception("%s: a shutdown hook failed", service.name)
                status = status or 1
    return status


def _start_web(service: DynamoService, instance: Any, config: ServiceConfig) -> Any:
    from dynamo.sdk.web import WebServer, build_app, listen

    section = config.get_parsed_config(service.name)
    port = int(section.get("port", os.environ.get(PORT_ENV, DEFAULT_PORT)))
    host = str(section.get("host", os.environ.get(HOST_ENV, DEFAULT_HOST)))
    app = build_app(service.app, instance, service.endpoints("http"))
    sock = listen(host, port)
    logger.info("%s web app on http://%s:%d", service.name, host, sock.getsockname()[1])
    return WebServer(app, sock)

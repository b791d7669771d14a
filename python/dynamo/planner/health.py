"""The planner's own HTTP port: ``/health``, its signals (``ok``, ``missing`` or ``stale``),
its fleet and its last decisions, as JSON, 200 while every signal is ``ok``, else 503; and
``/metrics``, the same state in the Prometheus text format (``dynamo.planner.metrics``).
A plain asyncio HTTP server: two routes, no framework."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from dynamo.planner.metrics import CONTENT_TYPE

#: Bound on reading one request's head.
READ_TIMEOUT = 5.0


class HealthServer:
    """Serves ``report()`` on ``GET /health`` and ``metrics()`` (if given) on ``GET /metrics``
    at ``127.0.0.1:port`` (0: a free port)."""

    def __init__(
        self,
        report: Callable[[], dict[str, Any]],
        host: str = "127.0.0.1",
        port: int = 0,
        metrics: Callable[[], bytes] | None = None,
    ) -> None:
        self.report = report
        self.metrics = metrics
        self.host = host
        self.port = port
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> int:
        """Start listening; the port."""
        self.server = await asyncio.start_server(self._serve, self.host, self.port)
        self.port = int(self.server.sockets[0].getsockname()[1])
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT)
            parts = head.split(b" ", 2)
            path = (parts[1].decode() if len(parts) > 1 else "").split("?")[0]
            kind = "application/json"
            if path == "/health":
                report = self.report()
                status = "200 OK" if report.get("status") == "ok" else "503 Service Unavailable"
                body = json.dumps(report, indent=1).encode()
            elif path == "/metrics" and self.metrics is not None:
                status, body, kind = "200 OK", self.metrics(), CONTENT_TYPE
            else:
                status, body = "404 Not Found", b'{"error": "not found"}'
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(body)}\r\n"
                f"Connection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def close(self) -> None:
        """Stop listening and wait for the server to close."""
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

"""A small client of resumable streams (docs/reliability.md, "Resumable streams"):
start a streamed request with ``X-Dynamo-Resumable: true``, read some events, drop the
connection, and resume with ``GET /v1/streams/{id}`` and ``Last-Event-ID``. Raw HTTP/1.1
on asyncio streams, every read bounded. Used by the fault tests and benches/resume.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

#: Bound on any single read (a stalled stream is an error, never a hang).
READ_BOUND = 30.0


@dataclass(frozen=True)
class Event:
    """One SSE event: its id (``None`` on a plain stream) and data."""

    id: int | None
    data: str


class HttpStatusError(Exception):
    """The server answered with a status other than 200."""

    def __init__(self, status: int, body: bytes):
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


class Stream:
    """An open SSE response; ``close()`` drops the connection (the client "disconnects")."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, headers: dict[str, str]):
        self.reader = reader
        self.writer = writer
        self.headers = headers
        self._buffer = b""
        self._chunked = headers.get("transfer-encoding", "") == "chunked"
        self._eof = False

    async def _more(self) -> bool:
        if self._eof:
            return False
        if not self._chunked:
            data = await asyncio.wait_for(self.reader.read(65536), READ_BOUND)
            self._eof = not data
            self._buffer += data
            return bool(data)
        size_line = await asyncio.wait_for(self.reader.readline(), READ_BOUND)
        if not size_line:
            raise ConnectionError("the connection closed before the end of the chunked response")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            self._eof = True
            return False
        self._buffer += (await asyncio.wait_for(self.reader.readexactly(size + 2), READ_BOUND))[:-2]
        return True

    async def events(self) -> AsyncIterator[Event]:
        """The events to the end of the response."""
        while True:
            while b"\n\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n\n", 1)
                event_id, data = None, []
                for line in raw.decode().splitlines():
                    if line.startswith("id:"):
                        event_id = int(line[3:].strip())
                    elif line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                if data:
                    yield Event(event_id, "\n".join(data))
            if not await self._more():
                return

    def close(self) -> None:
        self.writer.close()


async def request(port: int, method: str, path: str, body: Any = None,
                  headers: dict[str, str] | None = None) -> Stream:
    """Send a request and read the response head; a status other than 200 raises."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), READ_BOUND)
    payload = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close",
             "Content-Type: application/json", f"Content-Length: {len(payload)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_BOUND)
    status_line, *header_lines = head.decode().split("\r\n")
    status = int(status_line.split(" ")[1])
    response_headers = {k.strip().lower(): v.strip() for k, v in
                        (line.split(":", 1) for line in header_lines if ":" in line)}
    stream = Stream(reader, writer, response_headers)
    if status != 200:
        rest = b"".join([e.data.encode() async for e in stream.events()]) if stream._chunked else \
            await asyncio.wait_for(reader.read(), READ_BOUND)
        stream.close()
        raise HttpStatusError(status, rest)
    return stream


def content(events: list[Event]) -> str:
    """The generated text of chat or completions chunks, joined."""
    out = []
    for e in events:
        if e.data == "[DONE]":
            continue
        chunk = json.loads(e.data)
        if "error" in chunk:
            raise AssertionError(f"an error event: {e.data}")
        for choice in chunk.get("choices", []):
            out.append(choice.get("text") or (choice.get("delta") or {}).get("content") or "")
    return "".join(out)


async def read_all(stream: Stream) -> list[Event]:
    events = [e async for e in stream.events()]
    stream.close()
    return events


async def resumable_run(port: int, path: str, body: dict[str, Any], request_id: str, cut_after: int,
                        before_resume: Any = None, resume_port: int | None = None) -> tuple[list[Event], float]:
    """Start a resumable stream, drop it after ``cut_after`` events, await ``before_resume()``
    (if given), resume on ``resume_port`` (default: the same frontend) after the last event
    seen, and return every event the client got and the resume latency (seconds from
    sending the resume to its first event, or to its end when nothing was left)."""
    headers = {"X-Dynamo-Resumable": "true", "X-Request-Id": request_id}
    stream = await request(port, "POST", path, body, headers)
    seen: list[Event] = []
    async for event in stream.events():
        seen.append(event)
        if len(seen) >= cut_after:
            break
    stream.close()
    if before_resume is not None:
        await before_resume()
    last = {} if not seen else {"Last-Event-ID": str(seen[-1].id)}
    loop = asyncio.get_running_loop()
    sent = loop.time()
    resumed = await request(resume_port or port, "GET", f"/v1/streams/{request_id}", headers=last)
    latency = None
    async for event in resumed.events():
        if latency is None:
            latency = loop.time() - sent
        seen.append(event)
    resumed.close()
    return seen, latency if latency is not None else loop.time() - sent

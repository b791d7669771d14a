"""A closed-loop streaming load through the HTTP frontend, and what it saw.

Each client posts a streaming chat completion, reads the SSE stream to its end, and
records one `Outcome`: `ok` (a finish reason, `[DONE]`, and exactly `max_tokens`
completion tokens in the usage chunk when the finish reason is `length`), `error` (an
HTTP error status, or an SSE error event: an explicit failure, with its message),
`truncated` (the stream ended without `[DONE]` and without an error event: a silent
truncation, which must never happen), or `hung` (no end within the client's bound).

Raw HTTP/1.1 over asyncio streams: no client library between the test and the wire.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Tokens each request asks for.
MAX_TOKENS = 24
#: A request that has not ended after this many seconds counts as hung.
REQUEST_BOUND = 30.0


@dataclass
class Outcome:
    """How one request ended."""

    kind: str  # ok | error | truncated | hung
    started: float
    ended: float
    detail: str = ""

    @property
    def elapsed(self) -> float:
        return self.ended - self.started


def chat_body(model: str, index: int, max_tokens: int = MAX_TOKENS) -> bytes:
    """A streaming chat request with usage, distinct per client."""
    words = " ".join(f"w{3 + (index * 7 + i) % 500}" for i in range(40))
    return json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }).encode()


async def _read_body(reader: asyncio.StreamReader, chunked: bool, on_data: Any) -> None:
    if not chunked:
        on_data(await reader.read())
        return
    while True:
        size_line = await reader.readline()
        if not size_line:
            # The HTTP framing says the response was cut, so the client knows: an
            # error, not a truncation the server passed off as complete.
            raise ConnectionError("the connection closed before the end of the chunked response")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            await reader.readline()
            return
        on_data((await reader.readexactly(size + 2))[:-2])


async def stream_chat(port: int, body: bytes, max_tokens: int, bound: float = REQUEST_BOUND) -> Outcome:
    """One streaming request on a fresh connection, classified."""
    started = time.monotonic()
    writer: asyncio.StreamWriter | None = None

    async def run() -> Outcome:
        nonlocal writer
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: faults\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        status_line = await reader.readline()
        chunked = False
        while True:
            line = await reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            if name.lower() == "transfer-encoding" and "chunked" in value.lower():
                chunked = True
        parts = status_line.split()
        status = int(parts[1]) if len(parts) > 1 else 0
        if status != 200:
            raw = bytearray()
            await _read_body(reader, chunked, raw.extend)
            return Outcome("error", started, time.monotonic(), f"HTTP {status}: {bytes(raw)[:200]!r}")
        state: dict[str, Any] = {"pending": b"", "done": False, "error": None, "finish": None, "usage": None}

        def on_data(data: bytes) -> None:
            state["pending"] += data
            while b"\n\n" in state["pending"]:
                event, state["pending"] = state["pending"].split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                payload = event[6:]
                if payload == b"[DONE]":
                    state["done"] = True
                    continue
                chunk = json.loads(payload)
                if "error" in chunk:
                    state["error"] = chunk["error"].get("message", str(chunk["error"]))
                    continue
                for choice in chunk.get("choices") or []:
                    if choice.get("finish_reason"):
                        state["finish"] = choice["finish_reason"]
                if chunk.get("usage"):
                    state["usage"] = chunk["usage"]

        await _read_body(reader, chunked, on_data)
        ended = time.monotonic()
        if state["error"] is not None:
            if state["done"]:
                return Outcome("truncated", started, ended, f"an error event followed by [DONE]: {state['error']}")
            return Outcome("error", started, ended, f"SSE error: {state['error']}")
        if not state["done"] or state["finish"] is None:
            return Outcome("truncated", started, ended, f"ended without [DONE] or finish reason ({state['finish']})")
        tokens = (state["usage"] or {}).get("completion_tokens")
        if state["finish"] == "length" and tokens != max_tokens:
            return Outcome("truncated", started, ended, f"finish 'length' after {tokens} of {max_tokens} tokens")
        return Outcome("ok", started, ended, str(state["finish"]))

    try:
        return await asyncio.wait_for(run(), bound)
    except asyncio.TimeoutError:
        return Outcome("hung", started, time.monotonic(), f"no end within {bound:.0f}s")
    except (OSError, asyncio.IncompleteReadError, ValueError) as e:
        return Outcome("error", started, time.monotonic(), f"connection: {type(e).__name__}: {e}")
    finally:
        if writer is not None:
            writer.close()


@dataclass
class Load:
    """`clients` closed-loop clients against the frontend on `port` until stopped."""

    port: int
    model: str
    clients: int = 8
    max_tokens: int = MAX_TOKENS
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        for i in range(self.clients):
            self._tasks.append(asyncio.create_task(self._client(i)))

    def retarget(self, port: int) -> None:
        """Send the next requests to another port (a restarted frontend)."""
        self.port = port

    async def _client(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            body = chat_body(self.model, index * 1000 + n, self.max_tokens)
            outcome = await stream_chat(self.port, body, self.max_tokens)
            self.outcomes.append(outcome)
            n += 1
            if outcome.kind != "ok":
                # Do not spin on a fleet that refuses everything.
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Stop issuing requests and wait for the ones in flight (each is bounded)."""
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), REQUEST_BOUND + 10)

    def between(self, start: float, end: float) -> list[Outcome]:
        """Outcomes of requests started in [start, end)."""
        return [o for o in self.outcomes if start <= o.started < end]


@dataclass
class OpenLoad:
    """An open loop against the frontend on `port`: one request every `1 / rate` seconds
    whatever the answers (a queue builds when the fleet serves fewer), until stopped.
    `rate` may change while it runs (a load step)."""

    port: int
    model: str
    rate: float
    max_tokens: int = MAX_TOKENS
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _sender: asyncio.Task[None] | None = None
    _requests: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._sender = asyncio.create_task(self._send())

    async def _one(self, index: int) -> None:
        body = chat_body(self.model, index, self.max_tokens)
        self.outcomes.append(await stream_chat(self.port, body, self.max_tokens))

    async def _send(self) -> None:
        index, due = 0, time.monotonic()
        while not self._stop.is_set():
            if time.monotonic() >= due:
                self._requests.append(asyncio.create_task(self._one(index)))
                index += 1
                due += 1.0 / self.rate
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), max(0.0, due - time.monotonic()))

    async def stop(self) -> None:
        """Stop sending and wait for the requests in flight (each is bounded)."""
        self._stop.set()
        if self._sender is not None:
            await self._sender
        await asyncio.wait_for(asyncio.gather(*self._requests), REQUEST_BOUND + 10)


@dataclass
class Report:
    """One row of docs/reliability.md."""

    fault: str
    backend: str
    sent: int
    ok: int
    failed: int
    truncated: int
    hung: int
    reasons: list[str]
    error_p50: float | None
    error_max: float | None
    recovery: float | None

    def as_dict(self) -> dict[str, Any]:
        return self.__dict__.copy()


def summarize(fault: str, backend: str, load: Load, fault_end: float) -> Report:
    """Count what the load saw; recovery is the time from the fault's end until the
    first request that started after every later request succeeded."""
    outcomes = sorted(load.outcomes, key=lambda o: o.started)
    failures = [o for o in outcomes if o.kind == "error"]
    recovery = None
    last_bad = max((o.started for o in outcomes if o.kind != "ok"), default=None)
    if last_bad is None:
        recovery = 0.0
    else:
        after = [o for o in outcomes if o.started > last_bad and o.kind == "ok"]
        if after:
            recovery = max(0.0, after[0].started - fault_end)
    reasons = sorted({_reason(o.detail) for o in failures})
    times = [o.elapsed for o in failures]
    return Report(
        fault=fault,
        backend=backend,
        sent=len(outcomes),
        ok=sum(o.kind == "ok" for o in outcomes),
        failed=len(failures),
        truncated=sum(o.kind == "truncated" for o in outcomes),
        hung=sum(o.kind == "hung" for o in outcomes),
        reasons=reasons[:6],
        error_p50=statistics.median(times) if times else None,
        error_max=max(times) if times else None,
        recovery=recovery,
    )


def _reason(detail: str) -> str:
    """A failure's message without its ids, so equal causes group."""
    words = []
    for word in detail.split():
        if any(ch.isdigit() for ch in word) and len(word) > 6:
            word = "…"
        words.append(word)
    return " ".join(words)[:120]


def print_reliability(terminalreporter: Any, rows: list[dict[str, Any]]) -> None:
    """Print the reliability table of the fault suite's rows (``Report.as_dict()``) at
    the end of the session and, when ``DYN_FAULT_REPORT`` names a file, write them there
    as JSON (for docs/reliability.md)."""
    if not rows:
        return
    terminalreporter.section("reliability (fault suite)")
    terminalreporter.write_line(
        "| fault | backend | sent | ok | failed | truncated | hung | error time p50 / max (s) | recovery (s) | why |"
    )
    terminalreporter.write_line("|---|---|---|---|---|---|---|---|---|---|")

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        terminalreporter.write_line(
            f"| {r['fault']} | {r['backend']} | {r['sent']} | {r['ok']} | {r['failed']} | {r['truncated']} | "
            f"{r['hung']} | {s(r['error_p50'])} / {s(r['error_max'])} | {s(r['recovery'])} | "
            f"{'; '.join(r['reasons'])[:200]} |"
        )
    target = os.environ.get("DYN_FAULT_REPORT")
    if target:
        Path(target).write_text(json.dumps(rows, indent=2))

"""Observe the fleet without a metrics server: the frontend's own ``/metrics`` (Prometheus
text) and the workers' load reports on the event plane (``load_metrics`` subject of their
component, docs/mocker.md "Events": queued and running requests, KV blocks, prefix-cache
hit rate).

Histograms and counters are cumulative, so a *window* is the difference of two scrapes:
the request rate, the mean input/output lengths and the TTFT/ITL quantiles over the last
load interval (quantiles interpolated within a bucket, as Prometheus's
``histogram_quantile`` does). Each signal has a state, ``ok``, ``missing`` or ``stale``,
that the planner logs, serves on its ``/health``, and passes into every decision.
"""

from __future__ import annotations

import asyncio
import math
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from dynamo.planner.decide import Observation

PREFIX = "dynamo_frontend"
#: Bound on one scrape of the frontend's /metrics.
SCRAPE_TIMEOUT = 3.0


@dataclass
class Histogram:
    """Cumulative bucket counts (upper bound → count), with their sum and count."""

    buckets: dict[float, float] = field(default_factory=dict)
    total: float = 0.0
    count: float = 0.0

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations since ``earlier`` (all of them if the counters went back: a restart)."""
        if self.count < earlier.count:
            return self
        return Histogram(
            {le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
            self.total - earlier.total,
            self.count - earlier.count,
        )

    def quantile(self, q: float) -> float | None:
        """The ``q`` quantile, interpolated linearly inside its bucket; ``None`` when empty."""
        if self.count <= 0:
            return None
        rank = q * self.count
        lower, below = 0.0, 0.0
        for le in sorted(self.buckets):
            n = self.buckets[le]
            if n >= rank:
                if math.isinf(le):
                    return lower  # beyond the last finite bound: its bound, as Prometheus does
                return lower + (le - lower) * ((rank - below) / (n - below) if n > below else 1.0)
            lower, below = le, n
        return lower

    def mean(self) -> float | None:
        """The mean observation; ``None`` when empty."""
        return self.total / self.count if self.count > 0 else None


@dataclass
class FrontendSnapshot:
    """One scrape of the frontend's metrics for one model."""

    at: float
    #: Whether the frontend exports the families at all (``False``: a wrong URL or version).
    exported: bool
    requests: float = 0.0
    inflight: float = 0.0
    #: Requests that found no worker (a counter) and those waiting for one now (``--keep-models``).
    without_workers: float = 0.0
    waiting_for_workers: float = 0.0
    #: Requests held now because every worker is busy (``--busy-wait-s``).
    held_busy: float = 0.0
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    isl: Histogram = field(default_factory=Histogram)
    osl: Histogram = field(default_factory=Histogram)


def parse_frontend(text: str, model: str, at: float) -> FrontendSnapshot:
    """The series of ``model`` in the frontend's Prometheus text (zeros when the model has
    served nothing yet: the frontend creates its series on the first request). Any
    ``dynamo_frontend_*`` family marks the page as a frontend's."""
    histograms = {
        f"{PREFIX}_time_to_first_token_seconds": "ttft",
        f"{PREFIX}_inter_token_latency_seconds": "itl",
        f"{PREFIX}_input_sequence_tokens": "isl",
        f"{PREFIX}_output_sequence_tokens": "osl",
    }
    snap = FrontendSnapshot(at=at, exported=False)
    for family in text_string_to_metric_families(text):
        # A frontend that has served no request yet exports only its response counter
        # (the scrapes' own responses): still a frontend, with zeros.
        snap.exported = snap.exported or family.name.startswith(f"{PREFIX}_")
        if family.name == f"{PREFIX}_requests":
            snap.requests = sum(s.value for s in family.samples if s.labels.get("model") == model)
        elif family.name == f"{PREFIX}_inflight_requests":
            snap.inflight = sum(s.value for s in family.samples if s.labels.get("model") == model)
        elif family.name == f"{PREFIX}_requests_without_workers":  # the client strips `_total`
            snap.without_workers = sum(s.value for s in family.samples if s.labels.get("model") == model)
        elif family.name == f"{PREFIX}_requests_waiting_for_workers":
            snap.waiting_for_workers = sum(s.value for s in family.samples if s.labels.get("model") == model)
        elif family.name == f"{PREFIX}_requests_waiting_for_capacity":
            snap.held_busy = sum(s.value for s in family.samples if s.labels.get("model") == model)
        elif family.name in histograms:
            h: Histogram = getattr(snap, histograms[family.name])
            for s in family.samples:
                if s.labels.get("model") != model:
                    continue
                if s.name.endswith("_bucket"):
                    h.buckets[float(s.labels["le"])] = s.value
                elif s.name.endswith("_sum"):
                    h.total = s.value
                elif s.name.endswith("_count"):
                    h.count = s.value
    return snap


@dataclass(frozen=True)
class FrontendWindow:
    """What the frontend saw between two scrapes."""

    seconds: float
    #: Arrivals per second: requests that ended plus the growth of those in flight.
    request_rate: float
    inflight: float
    isl: float | None
    osl: float | None
    ttft_ms: float | None
    itl_ms: float | None
    #: Requests waiting for a worker at the later scrape, or that found none in between.
    waiting_for_workers: int = 0
    #: Requests the frontend held at the later scrape while every worker was busy: a
    #: backlog as real as the workers' own queues.
    held_busy: int = 0

    @staticmethod
    def between(earlier: FrontendSnapshot, later: FrontendSnapshot, ttft_q: float, itl_q: float) -> FrontendWindow:
        """The window from ``earlier`` to ``later``, quantiles at ``ttft_q`` and ``itl_q``."""
        seconds = max(later.at - earlier.at, 1e-9)
        ended = later.requests - earlier.requests
        if ended < 0:  # the frontend restarted
            ended = later.requests
        arrivals = max(0.0, ended + later.inflight - earlier.inflight)
        ttft, itl = later.ttft.minus(earlier.ttft), later.itl.minus(earlier.itl)
        ttft_s, itl_s = ttft.quantile(ttft_q), itl.quantile(itl_q)
        return FrontendWindow(
            seconds=seconds,
            request_rate=arrivals / seconds,
            inflight=later.inflight,
            isl=later.isl.minus(earlier.isl).mean(),
            osl=later.osl.minus(earlier.osl).mean(),
            ttft_ms=None if ttft_s is None else ttft_s * 1000.0,
            itl_ms=None if itl_s is None else itl_s * 1000.0,
            waiting_for_workers=int(
                later.waiting_for_workers + max(0.0, later.without_workers - earlier.without_workers)
            ),
            held_busy=int(later.held_busy),
        )


@dataclass
class SignalState:
    """The state of one signal, as ``/health`` shows it."""

    state: str  # ok | missing | stale
    detail: str = ""
    since: float = field(default_factory=time.monotonic)

    def as_dict(self, now: float) -> dict[str, Any]:
        """JSON-able, with the age of the state."""
        return {"state": self.state, "detail": self.detail, "for_s": round(now - self.since, 1)}


@dataclass(frozen=True)
class FleetLoad:
    """One role's workers as their fresh load reports show them (``LoadReports.load``)."""

    #: Workers with a fresh report.
    reporting: int = 0
    #: Requests queued in their engines, and running in them.
    waiting: int = 0
    running: int = 0
    #: KV cache blocks in use, and in all.
    kv_active_blocks: int = 0
    kv_total_blocks: int = 0
    #: The mean of the workers' prefix-cache hit rates, each as its engine counts it (the
    #: mocker since its start, vLLM since its last report); ``None`` without a report.
    prefix_hit_rate: float | None = None

    @property
    def kv_usage(self) -> float | None:
        """Blocks in use over blocks in all; ``None`` without a reported total."""
        return self.kv_active_blocks / self.kv_total_blocks if self.kv_total_blocks else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-able, as ``/health`` shows it."""
        usage, hit = self.kv_usage, self.prefix_hit_rate
        return {
            "reporting": self.reporting, "waiting": self.waiting, "running": self.running,
            "kv_active_blocks": self.kv_active_blocks, "kv_total_blocks": self.kv_total_blocks,
            "kv_usage": None if usage is None else round(usage, 4),
            "prefix_hit_rate": None if hit is None else round(hit, 4),
        }


def _count(report: dict[str, Any], key: str) -> int:
    """A report's count, 0 when absent or not a number."""
    value = report.get(key)
    return int(value) if isinstance(value, (int, float)) else 0


class LoadReports:
    """The latest load report of each worker of one role, with when it arrived."""

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s
        self.latest: dict[int, tuple[float, dict[str, Any]]] = {}

    def add(self, report: dict[str, Any], now: float | None = None) -> None:
        """Record one ``load_metrics`` event."""
        worker = report.get("worker_id")
        if isinstance(worker, int):
            self.latest[worker] = (time.monotonic() if now is None else now, report)

    def fresh(self, now: float) -> dict[int, dict[str, Any]]:
        """Reports younger than the stale bound, by worker."""
        return {w: r for w, (at, r) in self.latest.items() if now - at <= self.stale_after_s}

    def stale(self, now: float) -> list[int]:
        """Workers whose last report is older than the bound."""
        return sorted(w for w, (at, _) in self.latest.items() if now - at > self.stale_after_s)

    def forget(self, workers: Iterable[int]) -> None:
        """Drop workers that left (their reports would stay stale forever)."""
        for w in workers:
            self.latest.pop(w, None)

    def waiting(self, now: float) -> int:
        """Requests waiting in the workers' queues (fresh reports only)."""
        return self.load(now).waiting

    def load(self, now: float) -> FleetLoad:
        """The role's queues, running requests, KV blocks and prefix-cache hit rate, summed
        (the rate averaged) over the fresh reports."""
        reports = list(self.fresh(now).values())
        if not reports:
            return FleetLoad()
        rates = [float(r["gpu_prefix_cache_hit_rate"]) for r in reports
                 if isinstance(r.get("gpu_prefix_cache_hit_rate"), (int, float))]
        return FleetLoad(
            reporting=len(reports),
            waiting=sum(_count(r, "num_requests_waiting") for r in reports),
            running=sum(_count(r, "request_active_slots") for r in reports),
            kv_active_blocks=sum(_count(r, "kv_active_blocks") for r in reports),
            kv_total_blocks=sum(_count(r, "kv_total_blocks") for r in reports),
            prefix_hit_rate=sum(rates) / len(rates) if rates else None,
        )

    async def follow(self, subscription: AsyncIterator[Any]) -> None:
        """Record every report of ``subscription`` until it ends or the task is cancelled."""
        async for event in subscription:
            if isinstance(event, dict):
                self.add(event)


def fetch_text(url: str, timeout: float = SCRAPE_TIMEOUT) -> str:
    """GET ``url`` (blocking; run it in a thread)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


class FrontendObserver:
    """Scrapes the frontend every load interval and turns two scrapes into a window."""

    def __init__(self, url: str, model: str, stale_after_s: float, ttft_q: float, itl_q: float) -> None:
        self.url = url
        self.model = model
        self.stale_after_s = stale_after_s
        self.quantiles = (ttft_q, itl_q)
        self.previous: FrontendSnapshot | None = None
        self.signal = SignalState("missing", "not scraped yet")
        self.last_ok: float | None = None

    def _set(self, state: str, detail: str) -> None:
        if (state, detail) != (self.signal.state, self.signal.detail):
            self.signal = SignalState(state, detail)

    async def scrape(self) -> FrontendWindow | None:
        """One scrape; the window since the previous good one, or ``None`` (the signal
        then says why: unreachable, not exporting, or too long since the last scrape)."""
        now = time.monotonic()
        try:
            text = await asyncio.wait_for(asyncio.to_thread(fetch_text, self.url), SCRAPE_TIMEOUT + 1)
            snap = parse_frontend(text, self.model, now)
        except (OSError, urllib.error.URLError, asyncio.TimeoutError, ValueError) as e:
            old = self.last_ok is not None and now - self.last_ok > self.stale_after_s
            self._set("stale" if old else "missing", f"{self.url}: {type(e).__name__}: {e}")
            return None
        if not snap.exported:
            self._set("missing", f"{self.url} exports no {PREFIX}_* family (not a Dynamo frontend?)")
            return None
        previous, self.previous, self.last_ok = self.previous, snap, now
        if previous is None:
            self._set("missing", "first scrape: a window needs two")
            return None
        self._set("ok", "")
        return FrontendWindow.between(previous, snap, *self.quantiles)


def observation(window: FrontendWindow | None, waiting: int, missing: tuple[str, ...]) -> Observation:
    """The load loop's input from a frontend window and the workers' reports."""
    if window is None:
        return Observation(None, None, None, None, waiting=waiting, missing=missing or ("frontend_metrics",))
    return Observation(
        window.request_rate, window.isl, window.ttft_ms, window.itl_ms, waiting=waiting,
        waiting_for_workers=window.waiting_for_workers, inflight=window.inflight, missing=missing,
    )

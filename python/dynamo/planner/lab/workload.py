"""What the lab replays: a Mooncake-format trace, or a synthetic shape (``ramp``,
``step``) of open-loop Poisson arrivals; a trace re-timed onto a shape (``warp``); and
the ratio a perfect planner would reach on a shape (``best_ratio``)."""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynamo.planner.lab.settings import cache_dir
from dynamo.planner.predict import rates_of

#: The synthetic workloads, as (seconds, requests/s at the start, requests/s at the end)
#: segments, the rate linear within each. ``ramp``: 10 min at 2 req/s, a linear rise to
#: 20 over 5 min, 2 min at 20, a linear fall to 2 over 5 min, 10 min at 2 (32 min).
RAMP_PHASES = ((600.0, 2.0, 2.0), (300.0, 2.0, 20.0), (120.0, 20.0, 20.0), (300.0, 20.0, 2.0), (600.0, 2.0, 2.0))
#: ``step``: 5 min at 2 req/s, 5 min at 20, 5 min at 2 (the load step of ``recovery_s``).
STEP_PHASES = ((300.0, 2.0, 2.0), (300.0, 20.0, 20.0), (300.0, 2.0, 2.0))
SYNTHETIC = {"ramp": RAMP_PHASES, "step": STEP_PHASES}
#: Prompt and output tokens of every synthetic request.
RAMP_ISL, RAMP_OSL = 3072, 256


@dataclass
class Workload:
    """What the fleet replays: a trace file or a list of (ms, input, output) requests."""

    name: str
    trace: Path | None = None
    requests: list[tuple[float, int, int]] | None = None
    #: Timestamps divided by this.
    time_scale: float = 1.0
    #: A synthetic workload's rate over time (``RAMP_PHASES``), for ``best_ratio``.
    phases: Sequence[tuple[float, float, float]] | None = None

    def trace_rows(self) -> list[dict[str, Any]]:
        """The requests as replayed, as Mooncake-format rows: their timestamps (ms)
        divided by the time scale; a synthetic request shares no prefix blocks."""
        if self.requests is not None:
            return [
                {"timestamp": t / self.time_scale, "input_length": i, "output_length": o, "hash_ids": []}
                for t, i, o in self.requests
            ]
        assert self.trace is not None
        with self.trace.open() as lines:
            rows = [json.loads(line) for line in lines if line.strip()]
        return [{**r, "timestamp": float(r["timestamp"]) / self.time_scale} for r in rows]

    def write_trace(self, path: Path) -> int:
        """Write the requests as replayed to ``path`` as a Mooncake-format trace (a
        ``predictor.warm_start_trace``, or a trace to replay); how many."""
        rows = self.trace_rows()
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return len(rows)

    def rates(self, interval_s: float) -> list[float]:
        """Arrivals per second in each ``interval_s`` (time-scaled)."""
        return rates_of((r["timestamp"] / 1000.0 for r in self.trace_rows()), interval_s)

    def shape(self) -> tuple[float, float, float, list[int]]:
        """(duration s, mean input length, mean output length, input lengths)."""
        rows = [(r["timestamp"], int(r["input_length"]), int(r["output_length"])) for r in self.trace_rows()]
        if not rows:
            raise ValueError(f"{self.name}: no requests")
        duration = max(t for t, _, _ in rows) / 1000.0
        isls = [i for _, i, _ in rows]
        return duration, sum(isls) / len(isls), sum(o for _, _, o in rows) / len(rows), isls


def rate_at(phases: Sequence[tuple[float, float, float]], t: float) -> float:
    start = 0.0
    for seconds, r0, r1 in phases:
        if t < start + seconds:
            return r0 + (r1 - r0) * (t - start) / seconds
        start += seconds
    return 0.0


def ramp(seed: int, phases: Sequence[tuple[float, float, float]] = RAMP_PHASES) -> list[tuple[float, int, int]]:
    """Open-loop Poisson arrivals whose rate follows ``phases`` (linear within each),
    seeded: (ms, input, output). Drawn at the highest rate and thinned to the rate at
    each instant (Lewis and Shedler), so a linear rise is a rise, not a staircase."""
    rng = random.Random(seed)
    top = max(max(r0, r1) for _, r0, r1 in phases)
    end = sum(seconds for seconds, _, _ in phases)
    requests, t = [], rng.expovariate(top)
    while t < end:
        if rng.random() * top < rate_at(phases, t):
            requests.append((t * 1000.0, RAMP_ISL, RAMP_OSL))
        t += rng.expovariate(top)
    return requests


def best_ratio(phases: Sequence[tuple[float, float, float]], capacity: float) -> float:
    """The goodput-per-GPU ratio to static-peak that a perfect planner would reach on
    ``phases``: a fleet of ``ceil(rate / capacity)`` replicas at every instant (at least
    one, no start-up, no queue) against ``ceil(peak / capacity)`` for the whole time, the
    same requests served by both (integrated over 0.1 s steps)."""
    end = sum(seconds for seconds, _, _ in phases)
    top = max(max(r0, r1) for _, r0, r1 in phases)
    dt, oracle, t = 0.1, 0.0, 0.05
    while t < end:
        oracle += max(1, math.ceil(rate_at(phases, t) / capacity - 1e-9)) * dt
        t += dt
    return math.ceil(top / capacity - 1e-9) * end / oracle


def _segment_time(c: float, seconds: float, r0: float, r1: float) -> float:
    """The time into a segment (rate linear from ``r0`` to ``r1`` over ``seconds``) by which
    ``c`` requests have arrived: the root of ``r0 t + (r1 - r0) t^2 / (2 seconds) = c``."""
    a, b = (r1 - r0) / (2.0 * seconds), r0
    if abs(a) < 1e-12:
        return c / b if b > 0 else seconds
    root = b * b + 4.0 * a * c
    return min(seconds, max(0.0, (-b + math.sqrt(max(0.0, root))) / (2.0 * a)))


Phases = Sequence[tuple[float, float, float]]


def warp(stamps_ms: Sequence[float], phases: Phases) -> tuple[list[float], list[tuple[float, float, float]]]:
    """Re-time arrivals so that their rate follows the shape of ``phases``, keeping their
    order and their local bursts: ``phases``' rates are scaled so that the shape holds
    exactly ``len(stamps_ms)`` requests, and the arrival at fraction ``u`` of the
    original span moves to where the scaled shape has seen ``u`` of its requests (a flat
    trace comes out following the shape; a burst in it stays a burst). Returns the new
    times (ms) and the scaled phases."""
    if not stamps_ms:
        return [], list(phases)
    counts = [seconds * (r0 + r1) / 2.0 for seconds, r0, r1 in phases]
    total = sum(counts)
    if total <= 0 or any(r0 < 0 or r1 < 0 or seconds <= 0 for seconds, r0, r1 in phases):
        raise ValueError("a shape needs positive durations, rates >= 0 and some arrivals")
    k = len(stamps_ms) / total
    scaled = [(seconds, r0 * k, r1 * k) for seconds, r0, r1 in phases]
    first, last = min(stamps_ms), max(stamps_ms)
    span = last - first
    out = []
    for t in stamps_ms:
        target = len(stamps_ms) * ((t - first) / span if span > 0 else 0.5)
        start = 0.0
        for i, ((seconds, r0, r1), n) in enumerate(zip(scaled, (c * k for c in counts), strict=True)):
            if target <= n or i == len(scaled) - 1:
                out.append((start + _segment_time(min(target, n), seconds, r0, r1)) * 1000.0)
                break
            target -= n
            start += seconds
    return out, scaled


def workload_from(trace: str, time_scale: float, seed: int, limit: int | None, shape: str | None = None) -> Workload:
    """``ramp``, ``step`` or a trace file. Its first ``limit`` requests, and with ``shape``
    those re-timed onto that synthetic workload's shape by ``warp``, are written under the
    lab's cache as a trace of their own, prefix blocks and lengths kept."""
    if trace in SYNTHETIC:
        if shape is not None:
            raise ValueError("--shape re-times a trace file; 'ramp' and 'step' have their own shape")
        return Workload(trace, requests=ramp(seed, SYNTHETIC[trace]), time_scale=time_scale, phases=SYNTHETIC[trace])
    path = Path(trace)
    if shape is None and limit is None:
        return Workload(path.name, trace=path, time_scale=time_scale)
    if shape is not None and shape not in SYNTHETIC:
        raise ValueError(f"unknown shape '{shape}' ({', '.join(SYNTHETIC)})")
    with path.open() as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    rows = rows[:limit] if limit is not None else rows
    name = f"{path.name}[:{limit}]" if limit is not None else path.name
    if shape is not None:
        stamps, _ = warp([float(r["timestamp"]) for r in rows], SYNTHETIC[shape])
        rows = [{**r, "timestamp": round(t, 3)} for r, t in zip(rows, stamps, strict=True)]
        name = f"{name} on {shape}"
    text = "".join(json.dumps(r) + "\n" for r in rows)
    out = cache_dir() / f"trace-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    return Workload(name, trace=out, time_scale=time_scale)

"""The performance model: what one replica sustains within the targets.

A *profile* (JSON, written by a sweep of one worker over concurrency x input length)
records, per point, the time to first token, the inter-token latency (both at the
profile's ``quantile``) and the request throughput:

    {"version": 1, "engine": "mocker", "role": "agg", "quantile": 0.9, "osl": 64,
     "points": [{"isl": 128, "concurrency": 1, "ttft_ms": 21.0, "itl_ms": 5.2,
                 "throughput_rps": 2.9}, ...]}

``role`` says which worker was swept: an aggregated one (``agg``), a prefill worker
(``prefill``: one-token requests, so its TTFT is the prefill's) or a decode worker
(``decode``: prompts whose KV is already cached, so its ITL is the decode's).

``PerformanceModel.capacity`` interpolates it: along concurrency, linearly between the two
points around the largest concurrency whose latencies meet the targets; along input
length, along a power law between the two profiled lengths around the one asked (clamped
to the profiled range). ``PerformanceModel.slot_wait`` adds what a closed loop never
shows: where a curve's throughput stops growing (the engine runs a fixed number of
requests at a time), requests that arrive open-loop wait for a slot, and the wait is that
of an M/M/c queue over the fleet's slots (Erlang C). ``DisaggModel`` answers a
disaggregated fleet from a prefill worker's profile and a decode worker's.
``LiveCorrection`` scales the profile's latencies by what the running fleet shows
(observed ÷ predicted, smoothed), leaving out samples taken while a worker was in its
warm-up window: a new worker's first, slow passes describe its start, not its steady
state.
"""

from __future__ import annotations

import itertools
import json
import math
from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: A correction factor stays within [1/FACTOR_LIMIT, FACTOR_LIMIT]: one odd window must
#: not make the model say a replica does nothing (or everything).
FACTOR_LIMIT = 4.0


class ProfileError(ValueError):
    """A profile file cannot be used; the message says why."""


class ProfilePoint(BaseModel):
    """One measured operating point of one replica."""

    model_config = ConfigDict(extra="forbid")

    isl: int = Field(gt=0)
    concurrency: float = Field(gt=0)
    ttft_ms: float = Field(ge=0)
    itl_ms: float = Field(ge=0)
    throughput_rps: float = Field(ge=0)


class Profile(BaseModel):
    """A sweep of one replica (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid")

    version: int = 1
    engine: str = "unknown"
    #: The worker swept: ``agg``, ``prefill`` or ``decode`` (the module's docstring).
    role: Literal["agg", "prefill", "decode"] = "agg"
    quantile: float = Field(default=0.9, gt=0, lt=1)
    osl: int | None = None
    points: list[ProfilePoint] = Field(min_length=1)

    @model_validator(mode="after")
    def _grid(self) -> Profile:
        seen = set()
        for p in self.points:
            if (p.isl, p.concurrency) in seen:
                raise ValueError(f"two points at isl {p.isl}, concurrency {p.concurrency:g}")
            seen.add((p.isl, p.concurrency))
        return self

    def lengths(self) -> list[int]:
        """The profiled input lengths, ascending."""
        return sorted({p.isl for p in self.points})

    def curve(self, isl: int) -> list[ProfilePoint]:
        """The points of one profiled input length by concurrency."""
        return sorted((p for p in self.points if p.isl == isl), key=lambda p: p.concurrency)

    def save(self, path: Path) -> None:
        """Write the profile as JSON."""
        Path(path).write_text(json.dumps(self.model_dump(), indent=2) + "\n")


def load_profile(path: Path) -> Profile:
    """The profile in the JSON file at ``path``.

    Raises:
        ProfileError: unreadable, not JSON, or not a profile.
    """
    try:
        data: Any = json.loads(Path(path).read_text())
        return Profile.model_validate(data)
    except (OSError, ValueError) as e:
        detail = e.errors()[0] if isinstance(e, ValidationError) else e
        raise ProfileError(f"{path}: not a usable profile: {detail}") from None


def _lerp(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _along_length(isl: float, x0: float, x1: float, y0: float, y1: float) -> float:
    """A latency or a capacity between two profiled input lengths: a power law through
    both points (straight on log-log axes), linear where a value is 0. Prefill cost grows
    faster than the prompt (attention is quadratic in it), so capacity falls and latency
    rises along a power law; a straight line between two lengths overstates a replica in
    between (by 1.7x at the Mooncake trace's mean prompt, between its median and 90th
    percentile: docs/performance.md, "Planner lab")."""
    if x1 == x0 or min(x0, x1, y0, y1) <= 0:
        return _lerp(isl, x0, x1, y0, y1)
    return y0 * math.exp(math.log(y1 / y0) * math.log(isl / x0) / math.log(x1 / x0))


def _capacity_of_curve(curve: list[ProfilePoint], ttft_ms: float | None, itl_ms: float | None) -> float:
    """Requests/s of one replica at the largest concurrency meeting both limits (0: none)."""

    def meets(p: ProfilePoint) -> bool:
        return (ttft_ms is None or p.ttft_ms <= ttft_ms) and (itl_ms is None or p.itl_ms <= itl_ms)

    if not meets(curve[0]):
        return 0.0
    for low, high in itertools.pairwise(curve):
        if meets(high):
            continue
        # The limit is crossed between low and high: where, for each latency over it.
        edge = high.concurrency
        for limit, lo, hi in ((ttft_ms, low.ttft_ms, high.ttft_ms), (itl_ms, low.itl_ms, high.itl_ms)):
            if limit is not None and hi > limit:
                edge = min(edge, _lerp(limit, lo, hi, low.concurrency, high.concurrency))
        return _lerp(edge, low.concurrency, high.concurrency, low.throughput_rps, high.throughput_rps)
    return curve[-1].throughput_rps


#: A curve has saturated when its last doubling of concurrency (or more) added less than
#: this share of throughput; its slots are then the least concurrency within this share
#: of its most throughput.
SATURATION_GAIN = 0.05


def _saturation(curve: list[ProfilePoint]) -> tuple[float, float] | None:
    """(slots, requests/s) of a replica whose throughput stopped growing along ``curve``:
    the least concurrency within ``SATURATION_GAIN`` of the curve's most throughput, and
    that throughput. ``None``: the curve still grows at its last point (or has one point),
    so it says nothing of a slot limit."""
    last = curve[-1]
    below = [p for p in curve if p.concurrency <= last.concurrency / 2]
    if not below or last.throughput_rps >= (1 + SATURATION_GAIN) * below[-1].throughput_rps:
        return None
    most = max(p.throughput_rps for p in curve)
    if most <= 0:
        return None
    slots = next(p.concurrency for p in curve if p.throughput_rps >= (1 - SATURATION_GAIN) * most)
    return slots, most


def erlang_c(servers: int, offered: float) -> float:
    """The probability that an arrival waits in an M/M/c queue of ``servers`` servers
    under ``offered`` erlangs (arrival rate x mean service time; 1.0 at or over
    ``servers``). Erlang B by its recurrence (stable for any size), then C from B; written
    here because it is these few lines and no well-kept library of ours carries it."""
    if offered >= servers:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered * b / (k + offered * b)
    load = offered / servers
    return b / (1 - load + load * b)


def _on_curve(curve: list[ProfilePoint], concurrency: float) -> tuple[float, float]:
    """(TTFT, ITL) of one curve at ``concurrency``, clamped to its profiled range."""
    c = min(max(concurrency, curve[0].concurrency), curve[-1].concurrency)
    if len(curve) == 1:
        return curve[0].ttft_ms, curve[0].itl_ms
    i = max(1, min(len(curve) - 1, bisect_left([p.concurrency for p in curve], c)))
    low, high = curve[i - 1], curve[i]
    return (
        _lerp(c, low.concurrency, high.concurrency, low.ttft_ms, high.ttft_ms),
        _lerp(c, low.concurrency, high.concurrency, low.itl_ms, high.itl_ms),
    )


@dataclass(frozen=True)
class Sample:
    """What the fleet showed over one load interval, for the live correction."""

    #: Input length (tokens, mean) and requests in flight per ready replica.
    isl: float
    concurrency: float
    ttft_ms: float | None
    itl_ms: float | None
    #: Seconds since the youngest ready worker became ready.
    youngest_worker_age_s: float
    #: Requests waiting in the workers' queues, per ready replica.
    waiting: float = 0.0


#: A sample with more waiting requests than this per ready replica comes from a backlog:
#: its latencies are those of requests queued under an earlier load, not of its own.
BACKLOG_WAITING = 1.0


class LiveCorrection:
    """Observed ÷ predicted latency, smoothed (exponentially, weight ``smoothing``), per
    metric; samples from a fleet with a worker younger than ``warmup_s`` are left out, and
    so are samples taken with a backlog (more than ``BACKLOG_WAITING`` waiting requests per
    ready replica, or more requests in flight per replica than the profile measured):
    their latencies were set by the queue, which the profile's closed loop never sees."""

    def __init__(self, warmup_s: float, smoothing: float = 0.3) -> None:
        self.warmup_s = warmup_s
        self.smoothing = smoothing
        self.ttft_factor = 1.0
        self.itl_factor = 1.0
        self.used = 0
        self.excluded_warmup = 0
        self.excluded_backlog = 0

    def add(self, sample: Sample, predicted_ttft_ms: float | None, predicted_itl_ms: float | None) -> bool:
        """Fold one sample in; whether it was used (``False``: warm-up, or nothing to compare)."""
        if sample.youngest_worker_age_s < self.warmup_s:
            self.excluded_warmup += 1
            return False
        if sample.waiting > BACKLOG_WAITING:
            self.excluded_backlog += 1
            return False
        used = False
        for name, observed, predicted in (
            ("ttft_factor", sample.ttft_ms, predicted_ttft_ms),
            ("itl_factor", sample.itl_ms, predicted_itl_ms),
        ):
            if observed is None or not predicted:
                continue
            ratio = min(FACTOR_LIMIT, max(1.0 / FACTOR_LIMIT, observed / predicted))
            setattr(self, name, (1 - self.smoothing) * getattr(self, name) + self.smoothing * ratio)
            used = True
        self.used += used
        return used


class PerformanceModel:
    """A profile with its live correction: latencies and per-replica capacity."""

    def __init__(self, profile: Profile, correction: LiveCorrection | None = None) -> None:
        self.profile = profile
        self.correction = correction or LiveCorrection(warmup_s=0.0)
        self._lengths = profile.lengths()
        self._curves = {isl: profile.curve(isl) for isl in self._lengths}

    def _around(self, isl: float) -> tuple[int, int]:
        lengths = self._lengths
        if isl <= lengths[0]:
            return lengths[0], lengths[0]
        if isl >= lengths[-1]:
            return lengths[-1], lengths[-1]
        i = bisect_left(lengths, isl)
        return lengths[i - 1], lengths[i]

    def latency(self, isl: float, concurrency: float) -> tuple[float, float]:
        """Predicted (TTFT ms, ITL ms) of one replica at ``concurrency`` requests in flight,
        corrected by the live factors (clamped to the profiled concurrencies)."""
        values = [_on_curve(self._curves[length], concurrency) for length in self._around(isl)]
        lo, hi = self._around(isl)
        ttft = _along_length(isl, lo, hi, values[0][0], values[1][0])
        itl = _along_length(isl, lo, hi, values[0][1], values[1][1])
        return ttft * self.correction.ttft_factor, itl * self.correction.itl_factor

    def slot_wait(self, isl: float, rate: float, replicas: int, quantile: float) -> tuple[float, float] | None:
        """Where the profile shows the engine saturate (``_saturation``), what ``replicas``
        replicas sharing ``rate`` req/s of open-loop arrivals add to a request's TTFT: (the
        TTFT of a replica with its slots full, ms; the wait for a slot at ``quantile``, ms).
        The wait is an M/M/c queue's over all the fleet's slots, each serving the saturated
        throughput ÷ slots (``inf``: the slots cannot keep up; 0: fewer than ``1 -
        quantile`` of the arrivals wait at all). Exponential service overstates the wait
        of an engine whose requests take alike, which leaves margin where a closed-loop
        sweep left none. ``None``: a profiled length around ``isl`` never saturated, so
        the profile knows no slot limit."""
        lo, hi = self._around(isl)
        ends = [_saturation(self._curves[length]) for length in (lo, hi)]
        if ends[0] is None or ends[1] is None or replicas <= 0:
            return None
        slots = _lerp(isl, lo, hi, ends[0][0], ends[1][0])
        per_server = _along_length(isl, lo, hi, ends[0][1], ends[1][1]) / slots
        servers = max(1, round(slots * replicas))
        full, _ = self.latency(isl, slots)
        waits = erlang_c(servers, rate / per_server)
        spare = servers * per_server - rate
        if waits >= 1.0 or spare <= 0:
            return full, math.inf
        if waits <= 1.0 - quantile:
            return full, 0.0
        # P(wait > t) = C * exp(-spare * t), solved for the quantile.
        return full, 1000.0 * math.log(waits / (1.0 - quantile)) / spare

    def capacity(self, isl: float, ttft_ms: float | None, itl_ms: float | None) -> float:
        """Requests/s one replica serves with its TTFT ≤ ``ttft_ms`` and ITL ≤ ``itl_ms``
        (``None``: that latency is not a limit; a prefill pool minds TTFT only, a decode
        pool ITL only). 0 when even one request at a time misses them."""
        raw_ttft = None if ttft_ms is None else ttft_ms / self.correction.ttft_factor
        raw_itl = None if itl_ms is None else itl_ms / self.correction.itl_factor
        lo, hi = self._around(isl)
        at_lo = _capacity_of_curve(self._curves[lo], raw_ttft, raw_itl)
        at_hi = _capacity_of_curve(self._curves[hi], raw_ttft, raw_itl)
        return _along_length(isl, lo, hi, at_lo, at_hi)

    def correct(self, sample: Sample) -> bool:
        """Fold a live sample into the correction (see ``LiveCorrection.add``); a sample
        beyond the profiled concurrencies is left out as a backlog."""
        c = self.correction
        if sample.concurrency > max(curve[-1].concurrency for curve in self._curves.values()):
            c.excluded_backlog += 1
            return False
        ttft, itl = self.latency(sample.isl, sample.concurrency)
        # Predicted latencies before this correction's own factors: observed ÷ profile.
        return c.add(sample, ttft / c.ttft_factor, itl / c.itl_factor)


class DisaggModel(PerformanceModel):
    """The performance model of a disaggregated fleet: a prefill replica's profile and a
    decode replica's, one live correction for both. The ``Decider`` asks each role's
    capacity with the role's own limit only (prefill TTFT, decode ITL), so a question
    with a TTFT limit alone is a prefill replica's and is answered from the prefill
    profile, one with an ITL limit alone from the decode profile (both limits: the
    lesser). Predicted latencies (the live correction's reference) take TTFT from the
    prefill profile and ITL from the decode profile."""

    def __init__(self, prefill: Profile, decode: Profile, correction: LiveCorrection | None = None) -> None:
        super().__init__(prefill, correction)
        self.decode = PerformanceModel(decode, self.correction)

    def latency(self, isl: float, concurrency: float) -> tuple[float, float]:
        ttft, _ = super().latency(isl, concurrency)
        _, itl = self.decode.latency(isl, concurrency)
        return ttft, itl

    def capacity(self, isl: float, ttft_ms: float | None, itl_ms: float | None) -> float:
        if ttft_ms is None and itl_ms is None:
            return super().capacity(isl, None, None)
        capacities = []
        if ttft_ms is not None:
            capacities.append(super().capacity(isl, ttft_ms, None))
        if itl_ms is not None:
            capacities.append(self.decode.capacity(isl, None, itl_ms))
        return min(capacities)


def model_for(profiles: Mapping[str, Profile], correction: LiveCorrection | None = None) -> PerformanceModel:
    """The model of one worker profile per role: ``{"agg": ...}`` gives a
    ``PerformanceModel``, ``{"prefill": ..., "decode": ...}`` a ``DisaggModel``."""
    if "agg" in profiles:
        return PerformanceModel(profiles["agg"], correction)
    return DisaggModel(profiles["prefill"], profiles["decode"], correction)


if __name__ == "__main__":
    # ``python -m dynamo.planner.profile``: the sweep that writes a profile.
    import sys

    from dynamo.planner.sweep import main

    sys.exit(main())

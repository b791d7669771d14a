"""Demand forecasts: the next interval's value of a series (request rate, input or output
length) from the values seen so far.

Four models behind one interface, chosen by name (``make_predictor``): ``constant`` (the
last value), ``moving_average`` (the mean of the last ``window``), ``holt`` (Holt's
linear exponential smoothing: a level and a trend, each smoothed) and ``holt_winters``
(Holt's method plus an additive seasonal term of ``season`` intervals). statsmodels is
not installed here and would bring scipy and pandas for a few lines of arithmetic, so
both are the recurrences below, written out:

    level_t  = alpha * (x_t - s_{t-m}) + (1 - alpha) * (level_{t-1} + phi * trend_{t-1})
    trend_t  = beta * (level_t - level_{t-1}) + (1 - beta) * phi * trend_{t-1}
    s_t      = gamma * (x_t - level_t) + (1 - gamma) * s_{t-m}
    forecast_{t+h} = level_t + (phi + phi^2 + ... + phi^h) * trend_t + s_{t+h-m}    (h <= m)

Holt's method is the same with every ``s`` zero. ``phi`` (0 < phi <= 1) damps the trend
(Gardner and McKenzie's damped trend, statsmodels' ``damped_trend``): at 1 the trend
goes on forever, the plain method; under 1 a forecast h intervals ahead adds at most
``phi / (1 - phi)`` intervals of trend, so a rise that stops is not carried past its
top. For a fractional ``h`` the sum is ``phi * (1 - phi^h) / (1 - phi)``.

Holt-Winters starts once it has seen one season (level: its mean, trend: 0, each ``s``:
the value less that mean) and forecasts the mean of what it saw before that. A season
needs history the planner rarely has at start: ``warm_start`` (past values, e.g.
``trace_rates`` of a recorded trace) gives it. Every model never forecasts below zero.
"""

from __future__ import annotations

import json
import math
from collections import deque
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol


class Predictor(Protocol):
    """A one-step-ahead forecaster of a non-negative series."""

    def observe(self, value: float) -> None:
        """Add the value of the interval that just ended."""

    def predict(self, steps: float = 1.0) -> float | None:
        """The value ``steps`` intervals ahead (1: the next interval's); ``None`` before
        any value was observed. Only the trend models look further than the next."""


class ConstantPredictor:
    """Tomorrow is today: the last value seen."""

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = value

    def predict(self, steps: float = 1.0) -> float | None:
        return self._last


class MovingAveragePredictor:
    """The mean of the last ``window`` values."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self._values.append(value)

    def predict(self, steps: float = 1.0) -> float | None:
        return sum(self._values) / len(self._values) if self._values else None


def _damped_steps(phi: float, steps: float) -> float:
    """``phi + phi^2 + ... + phi^steps``: the intervals of trend a forecast ``steps`` ahead adds."""
    return steps if phi >= 1.0 else phi * (1.0 - phi**steps) / (1.0 - phi)


class HoltPredictor:
    """Holt's linear trend method, its trend damped by ``phi`` (see the module's docstring)."""

    def __init__(self, alpha: float, beta: float, phi: float = 1.0) -> None:
        if not (0.0 < alpha <= 1.0 and 0.0 <= beta <= 1.0):
            raise ValueError("Holt's method needs 0 < alpha <= 1 and 0 <= beta <= 1")
        if not 0.0 < phi <= 1.0:
            raise ValueError("the trend's damping phi must be in (0, 1]")
        self.alpha = alpha
        self.beta = beta
        self.phi = phi
        self._level: float | None = None
        self._trend = 0.0

    def observe(self, value: float) -> None:
        if self._level is None:
            self._level = value
            return
        previous, trend = self._level, self.phi * self._trend
        self._level = self.alpha * value + (1.0 - self.alpha) * (previous + trend)
        self._trend = self.beta * (self._level - previous) + (1.0 - self.beta) * trend

    def predict(self, steps: float = 1.0) -> float | None:
        if self._level is None:
            return None
        return max(0.0, self._level + _damped_steps(self.phi, steps) * self._trend)


class HoltWintersPredictor:
    """Holt-Winters' additive seasonal method (see the module's docstring)."""

    def __init__(self, alpha: float, beta: float, gamma: float, season: int, phi: float = 1.0) -> None:
        if not (0.0 < alpha <= 1.0 and 0.0 <= beta <= 1.0 and 0.0 <= gamma <= 1.0):
            raise ValueError("Holt-Winters needs 0 < alpha <= 1 and 0 <= beta, gamma <= 1")
        if season < 2:
            raise ValueError("a season is at least 2 intervals")
        if not 0.0 < phi <= 1.0:
            raise ValueError("the trend's damping phi must be in (0, 1]")
        self.alpha, self.beta, self.gamma, self.season, self.phi = alpha, beta, gamma, season, phi
        self._first: list[float] = []
        self._level = 0.0
        self._trend = 0.0
        #: The seasonal terms, the next interval's first.
        self._seasonal: deque[float] = deque()

    def observe(self, value: float) -> None:
        if len(self._first) < self.season:
            self._first.append(value)
            if len(self._first) == self.season:
                self._level = sum(self._first) / self.season
                self._seasonal = deque(x - self._level for x in self._first)
            return
        s = self._seasonal.popleft()
        previous, trend = self._level, self.phi * self._trend
        self._level = self.alpha * (value - s) + (1.0 - self.alpha) * (previous + trend)
        self._trend = self.beta * (self._level - previous) + (1.0 - self.beta) * trend
        self._seasonal.append(self.gamma * (value - self._level) + (1.0 - self.gamma) * s)

    def predict(self, steps: float = 1.0) -> float | None:
        if not self._first:
            return None
        if len(self._first) < self.season:
            return max(0.0, sum(self._first) / len(self._first))
        s = self._seasonal[(max(1, math.ceil(steps)) - 1) % self.season]
        return max(0.0, self._level + _damped_steps(self.phi, steps) * self._trend + s)


def rates_of(stamps_s: Iterable[float], interval_s: float) -> list[float]:
    """Arrivals per second in each ``interval_s`` from 0 to the last of ``stamps_s``
    (arrival times in seconds)."""
    counts: list[int] = []
    for at in stamps_s:
        slot = int(at // interval_s)
        counts.extend([0] * (slot + 1 - len(counts)))
        counts[slot] += 1
    return [c / interval_s for c in counts]


def trace_rates(path: Path, interval_s: float, time_scale: float = 1.0) -> list[float]:
    """Requests/s per ``interval_s`` of a Mooncake-format trace (JSON lines with a
    ``timestamp`` in ms), its timestamps divided by ``time_scale``: a warm start.

    Raises:
        ValueError: a line is not a request, or the interval or scale is not positive.
    """
    if interval_s <= 0 or time_scale <= 0:
        raise ValueError("the interval and the time scale must be > 0")
    stamps: list[float] = []
    with Path(path).open() as lines:
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                stamps.append(float(json.loads(line)["timestamp"]) / time_scale / 1000.0)
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{n}: not a trace request ({e})") from None
    return rates_of(stamps, interval_s)


def make_predictor(
    kind: str,
    *,
    window: int = 6,
    alpha: float = 0.5,
    beta: float = 0.3,
    gamma: float = 0.3,
    season: int = 24,
    phi: float = 1.0,
    warm_start: Iterable[float] = (),
) -> Predictor:
    """The predictor named ``kind`` (``constant``, ``moving_average``, ``holt``,
    ``holt_winters``; ``phi`` damps the trend of the last two), having observed
    ``warm_start`` in order.

    Raises:
        ValueError: an unknown ``kind`` or parameters out of range.
    """
    predictor: Predictor
    if kind == "constant":
        predictor = ConstantPredictor()
    elif kind == "moving_average":
        predictor = MovingAveragePredictor(window)
    elif kind == "holt":
        predictor = HoltPredictor(alpha, beta, phi)
    elif kind == "holt_winters":
        predictor = HoltWintersPredictor(alpha, beta, gamma, season, phi)
    else:
        raise ValueError(f"unknown predictor '{kind}' (constant, moving_average, holt, holt_winters)")
    for value in warm_start:
        predictor.observe(float(value))
    return predictor

"""Demand forecasts: the next interval's value of a series (request rate, input or output
length) from the values seen so far.

Three models behind one interface, chosen by name (``make_predictor``): ``constant`` (the
last value), ``moving_average`` (the mean of the last ``window``) and ``holt`` (Holt's
linear exponential smoothing: a level and a trend, each smoothed). statsmodels is not a
dependency; Holt's method is the two recurrences below, small enough to keep here:

    level_t = alpha * x_t + (1 - alpha) * (level_{t-1} + trend_{t-1})
    trend_t = beta * (level_t - level_{t-1}) + (1 - beta) * trend_{t-1}
    forecast_{t+1} = level_t + trend_t

No seasonal term (Holt-Winters): a season needs a period of history the planner rarely
has. Every model is warm-started from a list of past values (``warm_start``) and never
forecasts below zero.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Protocol


class Predictor(Protocol):
    """A one-step-ahead forecaster of a non-negative series."""

    def observe(self, value: float) -> None:
        """Add the value of the interval that just ended."""

    def predict(self) -> float | None:
        """The next interval's value; ``None`` before any value was observed."""


class ConstantPredictor:
    """Tomorrow is today: the last value seen."""

    def __init__(self) -> None:
        self._last: float | None = None

    def observe(self, value: float) -> None:
        self._last = value

    def predict(self) -> float | None:
        return self._last


class MovingAveragePredictor:
    """The mean of the last ``window`` values."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        self._values: deque[float] = deque(maxlen=window)

    def observe(self, value: float) -> None:
        self._values.append(value)

    def predict(self) -> float | None:
        return sum(self._values) / len(self._values) if self._values else None


class HoltPredictor:
    """Holt's linear trend method (see the module's docstring)."""

    def __init__(self, alpha: float, beta: float) -> None:
        if not (0.0 < alpha <= 1.0 and 0.0 <= beta <= 1.0):
            raise ValueError("Holt's method needs 0 < alpha <= 1 and 0 <= beta <= 1")
        self.alpha = alpha
        self.beta = beta
        self._level: float | None = None
        self._trend = 0.0

    def observe(self, value: float) -> None:
        if self._level is None:
            self._level = value
            return
        previous = self._level
        self._level = self.alpha * value + (1.0 - self.alpha) * (previous + self._trend)
        self._trend = self.beta * (self._level - previous) + (1.0 - self.beta) * self._trend

    def predict(self) -> float | None:
        if self._level is None:
            return None
        return max(0.0, self._level + self._trend)


def make_predictor(
    kind: str, *, window: int = 6, alpha: float = 0.5, beta: float = 0.3, warm_start: Iterable[float] = ()
) -> Predictor:
    """The predictor named ``kind`` (``constant``, ``moving_average``, ``holt``), having
    observed ``warm_start`` in order.

    Raises:
        ValueError: an unknown ``kind`` or parameters out of range.
    """
    predictor: Predictor
    if kind == "constant":
        predictor = ConstantPredictor()
    elif kind == "moving_average":
        predictor = MovingAveragePredictor(window)
    elif kind == "holt":
        predictor = HoltPredictor(alpha, beta)
    else:
        raise ValueError(f"unknown predictor '{kind}' (constant, moving_average, holt)")
    for value in warm_start:
        predictor.observe(float(value))
    return predictor

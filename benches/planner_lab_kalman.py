"""The planner lab over several seeds with its request-rate forecast made by a Kalman
filter instead of Holt's method: a probe, not a planner option (docs/performance.md,
"Twenty seeds, and a Kalman filter"; it was measured and not kept).

    python benches/planner_lab_kalman.py ramp --config lab.yaml --ttft-ms 1000 --itl-ms 60 \\
        --max-replicas 16 --seeds 0-19 --noise poisson --level 1 --trend 0.5

The filter is a local linear trend: a level and a slope per throughput interval, each a
random walk, observed through one interval's mean request rate. The observation noise is
that of Poisson arrivals over the interval (variance: the level ÷ the interval's
seconds), so the filter trusts a window more where its arrivals are many. The process
noise, per interval, is either in units of that Poisson variance (``--noise poisson``:
the gains do not depend on the rate, and the filter settles on the gains of a Holt
predictor) or absolute, in (req/s)² (``--noise absolute``: the gains fall as the rate
rises). The input-length forecast stays Holt's. Takes ``benches/planner_lab_seeds.py``'s
arguments and these three.
"""

from __future__ import annotations

import argparse
import sys

import planner_lab_seeds
from dynamo.planner import step
from dynamo.planner.config import PlannerConfig
from dynamo.planner.decide import Decider

#: The process noise: "poisson" or "absolute", and the level's and the slope's standard
#: deviation per interval (set by ``main`` before the seeds run in forked workers).
NOISE = {"kind": "poisson", "level": 1.0, "trend": 0.5}


class KalmanRate:
    """A local-linear-trend Kalman filter over one throughput interval's request rate."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.level: float | None = None
        self.slope = 0.0
        #: The state's covariance, row by row: (level, level), (level, slope), (slope, slope).
        self.p = (0.0, 0.0, 0.0)

    def _poisson(self, level: float) -> float:
        """The variance of one interval's mean rate of Poisson arrivals at ``level``."""
        return max(level, 1.0 / self.interval_s) / self.interval_s

    def observe(self, value: float) -> None:
        if self.level is None:
            self.level = value
            r = self._poisson(value)
            self.p = (r, 0.0, r)
            return
        # Predict one interval on.
        level, slope = self.level + self.slope, self.slope
        ll, ls, ss = self.p
        ll, ls = ll + 2 * ls + ss, ls + ss
        r = self._poisson(level)
        scale = r if NOISE["kind"] == "poisson" else 1.0
        ll += NOISE["level"] ** 2 * scale
        ss += NOISE["trend"] ** 2 * scale
        # Update with the observed rate.
        innovation, s = value - level, ll + r
        k_level, k_slope = ll / s, ls / s
        self.level, self.slope = level + k_level * innovation, slope + k_slope * innovation
        self.p = ((1 - k_level) * ll, (1 - k_level) * ls, ss - k_slope * ls)

    def predict(self, steps: float = 1.0) -> float | None:
        if self.level is None:
            return None
        return max(0.0, self.level + steps * self.slope)


_init = step.PlanningState.__init__


def _with_kalman(self: step.PlanningState, config: PlannerConfig, decider: Decider) -> None:
    """``PlanningState`` with its rate predictor replaced by the filter (warm start replayed)."""
    _init(self, config, decider)
    kalman = KalmanRate(config.intervals.throughput_s)
    for value in step.warm_start_rates(config):
        kalman.observe(float(value))
    self.rate_predictor = kalman


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--noise", choices=("poisson", "absolute"), default="poisson",
                     help="process noise in units of the Poisson variance, or in (req/s)^2 (default poisson)")
    own.add_argument("--level", type=float, default=1.0, help="the level's process noise, a standard deviation")
    own.add_argument("--trend", type=float, default=0.5, help="the slope's process noise, a standard deviation")
    mine, rest = own.parse_known_args()
    NOISE.update(kind=mine.noise, level=mine.level, trend=mine.trend)
    step.PlanningState.__init__ = _with_kalman  # type: ignore[method-assign]
    sys.argv = [sys.argv[0], *rest]
    return planner_lab_seeds.main()


if __name__ == "__main__":
    sys.exit(main())

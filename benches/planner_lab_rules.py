"""The planner lab over several seeds with one or more scale rules changed: probes, not
planner options (docs/performance.md, "The trace's low phases: two rules measured, not
kept"; each was measured and not kept).

    python benches/planner_lab_rules.py ../shared/traces/mooncake_conversation_trace.jsonl \\
        --shape ramp --config lab.yaml --ttft-ms 60000 --itl-ms 200 --max-replicas 64 \\
        --seeds 0-3 --rule level --rule sqrt

Takes ``benches/planner_lab_seeds.py``'s arguments and ``--rule`` (repeatable):

* ``backlog``: requests waiting in the replicas' own engine queues count at most one
  replica for each replica that holds one (they are served there whatever is added);
  a queue before the replicas is sized as before.
* ``level``: the hold of a scale-down while the forecast rises applies only while the
  forecast is at or above the mean rate of the recent load windows (a forecast climbing
  back to a rate already arriving is not a rising demand).
* ``sqrt``: a scale-down is also refused while the replicas left would be fewer than
  ``R + cv * sqrt(R)``: ``R`` the arrival rate over the profile's capacity, ``cv`` the
  coefficient of variation of the workload's prompt lengths (square-root staffing; 0
  for fixed prompts, which it then leaves alone). The prototype reads ``cv`` from the
  workload; a planner would have to observe it.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import planner_lab_seeds
from dynamo.planner import lab
from dynamo.planner.decide import Decider, Observation, RoleState

replay = importlib.import_module("dynamo.planner.lab.replay")

#: The last window's replicas holding an engine queue, and the queue before them (set
#: where the lab reads its waiting requests, read where the decider sizes a backlog).
QUEUES = {"held": 0, "front": 0}
#: The workload's prompts' coefficient of variation (set by ``main``).
SPREAD = {"cv": 0.0}


def _backlog_rule() -> None:
    waiting_of = replay._waiting

    def _waiting(window: dict[str, Any], roles: Sequence[str]) -> dict[str, int]:
        QUEUES["held"] = sum(1 for r in window["replicas"] if r["role"] == "agg" and r["waiting"] > 0)
        QUEUES["front"] = window["frontend_queue"]
        return waiting_of(window, roles)

    needed_of = Decider._needed

    def _needed(self: Decider, role: str, obs: Observation) -> int | None:
        # The engine queues count for at most one replica's throughput interval each of
        # the replicas holding them; the decider's own sizing does the rest.
        isl = self.isl_forecasts.get(role, obs.isl)
        if self.model is not None and isl is not None:
            capacity = self.model.capacity(isl, *self._limits(role))
            front = min(QUEUES["front"], obs.waiting)
            held = min(obs.waiting - front, QUEUES["held"] * self.config.intervals.throughput_s * capacity)
            obs = dataclasses.replace(obs, waiting=front + math.ceil(held - 1e-9))
        return needed_of(self, role, obs)

    replay._waiting = _waiting
    Decider._needed = _needed  # type: ignore[method-assign]


def _level_rule() -> None:
    shrink = Decider._shrink

    def _shrink(self: Decider, role: str, fleet: Mapping[str, RoleState], obs: Observation) -> Any:
        forecasts = self.forecasts.get(role, [])
        recent = [r for _, r in self.recent_rates[role]]
        if len(forecasts) >= 2 and recent and forecasts[-2] < forecasts[-1] < sum(recent) / len(recent):
            # Seen as level for this pass: the rising hold does not apply.
            self.forecasts[role] = [*forecasts[:-2], forecasts[-1], forecasts[-1]]
            try:
                return shrink(self, role, fleet, obs)
            finally:
                self.forecasts[role] = forecasts
        return shrink(self, role, fleet, obs)

    Decider._shrink = _shrink  # type: ignore[method-assign]


def _sqrt_rule() -> None:
    fits_with = Decider._fits_with

    def _fits_with(
        self: Decider, role: str, ready: int, serving: int, obs: Observation, margin: float,
    ) -> tuple[bool, str]:
        fits, why = fits_with(self, role, ready, serving, obs, margin)
        if not fits or why == "no demand" or self.model is None or not obs.isl or not obs.request_rate:
            return fits, why
        capacity = self.model.capacity(self.isl_forecasts.get(role, obs.isl), *self._limits(role))
        if capacity <= 0:
            return fits, why
        load = obs.request_rate / capacity
        needed = load + SPREAD["cv"] * math.sqrt(load)
        if serving < needed:
            return False, f"square-root staffing: {needed:.1f} replicas at {obs.request_rate:.2f} req/s"
        return fits, why

    Decider._fits_with = _fits_with  # type: ignore[method-assign]


RULES = {"backlog": _backlog_rule, "level": _level_rule, "sqrt": _sqrt_rule}


def main() -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--rule", action="append", choices=sorted(RULES), required=True, help="a rule to change")
    mine, rest = own.parse_known_args()
    if "sqrt" in mine.rule:
        seeds = argparse.ArgumentParser(add_help=False)
        seeds.add_argument("--seeds")
        seeds.add_argument("--history", action="store_true")
        args = lab.parse_args(seeds.parse_known_args(rest)[1])
        _, _, _, isls = lab.workload_from(args.trace, args.time_scale, args.seed, args.limit, args.shape).shape()
        SPREAD["cv"] = statistics.pstdev(isls) / statistics.mean(isls)
    for rule in dict.fromkeys(mine.rule):
        RULES[rule]()
    sys.argv = [sys.argv[0], *rest]
    return planner_lab_seeds.main()


if __name__ == "__main__":
    sys.exit(main())

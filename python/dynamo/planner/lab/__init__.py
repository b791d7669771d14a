"""The planner lab, ``python -m dynamo.planner.lab TRACE``. Replays an open-loop trace (a
Mooncake-format file, or ``ramp``: 2 → 20 → 2 req/s) through a simulated mocker fleet on
a virtual clock (``dynamo._core.PlannerLab``), with the planner's own steps
(``dynamo.planner.step``: the same predictors, performance model and ``Decider`` as
``python -m dynamo.planner``) resizing it every load and throughput interval, and
compares four configurations, one row each:

* ``static-peak``: the smallest fixed fleet whose p90 TTFT and ITL over the whole trace
  meet the targets (found by bisection over 1..``max_replicas``; disaggregated, the
  (prefill, decode) pair with the fewest GPUs that a coordinate search finds:
  ``static_peak_pair``);
* ``static-mean``: a fixed fleet sized for the mean rate by the performance model (each
  role by its own target, as the planner's ``Decider`` sizes it);
* ``load-only``: the planner without a profile (the load loop alone);
* ``planner``: both loops, with a profile of the simulated engine.

The profile is measured on the simulated engine itself (``planner_lab_point``: one
replica at a fixed concurrency, per input length) and cached, so no file is needed.
With roles ``prefill`` and ``decode`` the fleet is disaggregated (two pools, each
resized by the planner's decision for its role; docs/planner.md, "The lab"), and the
planner's model answers each role from a profile of a replica in that role
(``DisaggModel``).
Each request counts as *good* when its TTFT and its mean inter-token latency are within
the targets; figures per row are described in docs/planner.md ("The lab").

The package, one concern a module, imports running down the list: ``settings`` (the
knobs, the cache), ``workload`` (what arrives), ``engine`` (the simulated fleet and its
profile), ``replay`` (one configuration's run), ``score`` (a run's figures), ``compare``
(the four configurations), ``report`` (table and plot) and ``cli`` (the command).
"""

from dynamo.planner.lab.cli import main, parse_args, settings_from
from dynamo.planner.lab.compare import (
    CONFIGS,
    compare,
    planning_state,
    static_mean_fleet,
    static_peak,
    static_peak_pair,
)
from dynamo.planner.lab.engine import Fleet, profile_for, profiles_for, simulated_fleet
from dynamo.planner.lab.replay import Run, quantile, replay
from dynamo.planner.lab.report import format_table, plot
from dynamo.planner.lab.score import broken_after_s, first_broken_run_end, meets, recovery_s, row
from dynamo.planner.lab.settings import Settings, cache_dir
from dynamo.planner.lab.workload import (
    RAMP_ISL,
    RAMP_OSL,
    RAMP_PHASES,
    STEP_PHASES,
    SYNTHETIC,
    Workload,
    best_ratio,
    ramp,
    rate_at,
    warp,
    workload_from,
)

__all__ = [
    "CONFIGS", "RAMP_ISL", "RAMP_OSL", "RAMP_PHASES", "STEP_PHASES", "SYNTHETIC", "Fleet", "Run", "Settings",
    "Workload", "best_ratio", "broken_after_s", "cache_dir", "compare", "first_broken_run_end", "format_table",
    "main", "meets", "parse_args", "planning_state", "plot", "profile_for", "profiles_for", "quantile", "ramp",
    "rate_at", "recovery_s", "replay", "row", "settings_from", "simulated_fleet", "static_mean_fleet",
    "static_peak", "static_peak_pair", "warp", "workload_from",
]

"""The planner's urgent check between load passes (``intervals.urgent_s``): a queue that
builds in the workers raises the fleet at once, sized by the profile for the backlog and
its growth, the replicas added counted at their warm-up speed; noise, a draining queue,
a replica already starting or no profile leave it alone; and in the lab a load step is
answered seconds after it, not at the next load pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dynamo.planner.config import build_config
from dynamo.planner.decide import Decider, RoleState
from dynamo.planner.lab import Settings, Workload, compare, ramp
from dynamo.planner.observe import FrontendWindow
from dynamo.planner.profile import PerformanceModel, Profile
from dynamo.planner.step import PlanningState

ISL = 128


def profile() -> Profile:
    """Latency linear in concurrency; one replica does c req/s at concurrency c (5 req/s
    within the targets below)."""
    points = [
        {"isl": ISL, "concurrency": c, "ttft_ms": 100.0 * c, "itl_ms": 10.0 * c, "throughput_rps": float(c)}
        for c in (1, 2, 4, 8, 16)
    ]
    return Profile.model_validate({"points": points})


def state(model: bool = True, **extra: Any) -> PlanningState:
    data: dict[str, Any] = {
        "model": "m", "targets": {"ttft": {"ms": 500}, "itl": {"ms": 50}},
        "roles": {"agg": {"min_replicas": 1, "max_replicas": 20}}, "intervals": {"throughput_s": 60, "load_s": 10},
    }
    data.update(extra)
    config = build_config(data)
    s = PlanningState(config, Decider(config, PerformanceModel(profile()) if model else None))
    fleet = {"agg": RoleState(ready=1)}
    s.note_fleet(fleet, 0.0)
    window = FrontendWindow(seconds=10, request_rate=4.0, inflight=4, isl=ISL, osl=None, ttft_ms=400, itl_ms=40)
    s.load_step(window, fleet, {"agg": 0}, (), 0.0)
    return s


ONE = RoleState(ready=1)


def checks(s: PlanningState, waiting: list[int], fleet: RoleState = ONE) -> list[list[int]]:
    """The urgent check once a second with these waiting requests: each one's targets."""
    return [[d.target for d in s.urgent_step({"agg": fleet}, {"agg": w}, 1.0 + i)] for i, w in enumerate(waiting)]


def test_a_building_queue_raises_the_fleet_at_the_third_rise() -> None:
    s = state()
    # 2 -> 20 -> 40 -> 60 waiting: 19.3 a second on top of the 5 req/s the saturated
    # replica serves (its capacity: more than the last window's 4), plus 60 waiting served
    # within the throughput interval (1 req/s): 25.3 req/s at 5 a replica is 6 replicas.
    assert checks(s, [2, 20, 40, 60]) == [[], [], [], [6]]
    # Once those are asked for, the queue that still grows until they are ready asks nothing more.
    assert s.urgent_step({"agg": RoleState(ready=1, pending=4)}, {"agg": 80}, 5.0) == []
    [decision] = s.urgent_step({"agg": RoleState(ready=1)}, {"agg": 100}, 6.0)
    assert (decision.loop, decision.action, decision.current, decision.target) == ("urgent", "up", 1, 6)


def test_a_step_after_a_quiet_window_is_sized_at_the_last_input_length_seen() -> None:
    s = state()
    # A load window in which no request ended has no input length (and no rate): the
    # queue that then builds is sized at the last length seen, at the replica's capacity
    # (5 req/s) plus its growth (19.3 a second) and the backlog (1 req/s), not at rate 0.
    quiet = FrontendWindow(seconds=10, request_rate=0.0, inflight=0, isl=None, osl=None, ttft_ms=None, itl_ms=None)
    s.load_step(quiet, {"agg": ONE}, {"agg": 0}, (), 10.0)
    assert checks(s, [2, 20, 40, 60]) == [[], [], [], [6]]


def test_the_added_replicas_count_at_their_warm_up_speed() -> None:
    # Half speed while warming up: the 5 replicas added count as 2.5, so 10 are added.
    assert checks(state(warmup_speed=0.5), [2, 20, 40, 60]) == [[], [], [], [11]]


def test_noise_a_queue_that_dips_a_starting_replica_or_no_profile_change_nothing() -> None:
    assert checks(state(), [0, 1, 0, 1, 2, 1]) == [[]] * 6  # never more waiting than ready for long
    assert checks(state(), [2, 20, 15, 60, 70]) == [[]] * 5  # a dip: not three rises in a row
    assert checks(state(), [2, 20, 40, 60], RoleState(ready=1, pending=1)) == [[]] * 4
    assert checks(state(model=False), [2, 20, 40, 60]) == [[]] * 4
    # A fleet at its max_replicas is left alone (a queue that builds on saturated replicas
    # always needs more than they are: what they serve plus its growth).
    capped = state(roles={"agg": {"min_replicas": 1, "max_replicas": 1}})
    assert checks(capped, [2, 20, 40, 60]) == [[]] * 4


def test_a_rise_within_the_noise_of_the_arrivals_changes_nothing() -> None:
    six = RoleState(ready=6)  # 30 req/s within the targets; 20 req/s arrive

    def busy() -> PlanningState:
        s = state()
        window = FrontendWindow(seconds=10, request_rate=20.0, inflight=20, isl=ISL, osl=None, ttft_ms=333, itl_ms=33)
        s.load_step(window, {"agg": six}, {"agg": 0}, (), 0.5)
        return s

    # 9 more waiting over 3 s: the count of 60 arrivals varies by 7.7 (one standard
    # deviation), so a rise under two is a fleet that keeps up, not a queue that builds.
    assert checks(busy(), [6, 9, 12, 15], six) == [[]] * 4
    # 30 more is one: 30 req/s served + 10 a second of growth + 36 waiting served within
    # the throughput interval (0.6 req/s) is 9 replicas.
    assert checks(busy(), [6, 16, 26, 36], six) == [[], [], [], [9]]


def test_off_without_an_interval() -> None:
    config = build_config({"model": "m", "intervals": {"urgent_s": None}})
    assert config.intervals.urgent_s is None
    assert build_config({"model": "m"}).intervals.urgent_s == 1.0


def test_the_lab_answers_a_load_step_before_the_next_load_pass(tmp_path: Path) -> None:
    # 2 req/s for 120 s, then 20 req/s: the first load pass after the step is at 130 s.
    workload = Workload("step", requests=ramp(0, ((120.0, 2.0, 2.0), (60.0, 20.0, 20.0))))

    def fleet_at_first_pass_after_step(urgent_s: float | None) -> int:
        config = build_config({
            "model": "lab", "targets": {"ttft": {"ms": 1000}, "itl": {"ms": 60}},
            "roles": {"agg": {"min_replicas": 1, "max_replicas": 16}},
            "intervals": {"load_s": 10, "throughput_s": 20, "urgent_s": urgent_s},
        })
        settings = Settings(config=config, startup_s=10.0, warmup_s=5.0, cache_dir=tmp_path)
        _, runs = compare(workload, settings, ("planner",), log=lambda m: None)
        # The timeline's replicas (starting + ready) at a window's end, before that pass acts.
        return next(n for end, n, *_ in runs["planner"].timeline if end == 130.0)

    assert fleet_at_first_pass_after_step(None) == 1
    assert fleet_at_first_pass_after_step(1.0) >= 6

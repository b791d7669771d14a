"""Demand forecasts: each model on the series it is for, and warm starts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dynamo.planner.config import build_config
from dynamo.planner.decide import Decider
from dynamo.planner.predict import make_predictor, trace_rates
from dynamo.planner.step import PlanningState


@pytest.mark.parametrize("kind", ["constant", "moving_average", "holt", "holt_winters"])
def test_nothing_seen_is_no_forecast_and_a_constant_stays(kind: str) -> None:
    predictor = make_predictor(kind)
    assert predictor.predict() is None
    for _ in range(20):
        predictor.observe(7.0)
    assert predictor.predict() == pytest.approx(7.0)


def test_moving_average_is_the_mean_of_its_window() -> None:
    predictor = make_predictor("moving_average", window=3, warm_start=[100, 1, 2, 3])
    assert predictor.predict() == pytest.approx(2.0)


def test_holt_follows_a_ramp_where_the_others_lag() -> None:
    ramp = [2.0 * i for i in range(1, 21)]  # the next value is 42
    holt = make_predictor("holt", alpha=0.5, beta=0.3, warm_start=ramp)
    average = make_predictor("moving_average", window=6, warm_start=ramp)
    constant = make_predictor("constant", warm_start=ramp)
    assert holt.predict() == pytest.approx(42.0, abs=0.5)
    assert average.predict() == pytest.approx(35.0)
    assert constant.predict() == 40.0


def test_holt_forecasts_further_ahead_along_its_trend() -> None:
    ramp = [2.0 * i for i in range(1, 21)]  # 44 two intervals on, 45 two and a half
    holt = make_predictor("holt", alpha=0.5, beta=0.3, warm_start=ramp)
    assert holt.predict(2.5) == pytest.approx(45.0, abs=0.5)
    assert holt.predict(2.5) > holt.predict() > 40.0
    # The models without a trend look no further than the next interval.
    for kind in ("constant", "moving_average"):
        model = make_predictor(kind, warm_start=ramp)
        assert model.predict(3.0) == model.predict()
    winters = make_predictor("holt_winters", season=4, warm_start=[2.0, 6.0, 2.0, 6.0, 2.0, 6.0])
    assert (winters.predict(1.0), winters.predict(2.0)) == (pytest.approx(2.0, abs=0.5), pytest.approx(6.0, abs=0.5))


def test_a_damped_trend_stops_where_a_plain_one_goes_on() -> None:
    # A rise that has stopped: 2, 4, ... 40, then flat at 40.
    series = [2.0 * i for i in range(1, 21)] + [40.0] * 2
    plain = make_predictor("holt", alpha=0.5, beta=0.3, warm_start=series)
    damped = make_predictor("holt", alpha=0.5, beta=0.3, phi=0.8, warm_start=series)
    # The plain trend carries the forecast on in proportion to the horizon; the damped
    # one adds at most phi / (1 - phi) = 4 intervals of its trend, however far it looks.
    assert plain.predict(10.0) - plain.predict(5.0) == pytest.approx(5.0 * (plain.predict(2.0) - plain.predict()))
    assert damped.predict(1000.0) - damped.predict() < 4.0 * (damped.predict(2.0) - damped.predict()) / 0.8**2
    assert 40.0 < damped.predict(10.0) < plain.predict(10.0)
    # phi 1 is the plain method, for Holt-Winters too.
    same = make_predictor("holt", alpha=0.5, beta=0.3, phi=1.0, warm_start=series)
    assert same.predict(3.0) == plain.predict(3.0)
    seasonal = [2.0, 6.0] * 6 + [4.0, 8.0, 6.0, 10.0]
    winters = make_predictor("holt_winters", season=2, warm_start=seasonal)
    damped_winters = make_predictor("holt_winters", season=2, phi=0.5, warm_start=seasonal)
    assert damped_winters.predict(8.0) < winters.predict(8.0)


def test_holt_never_forecasts_negative_demand() -> None:
    holt = make_predictor("holt", alpha=0.9, beta=0.9, warm_start=[20, 10, 2, 0])
    assert holt.predict() == 0.0


def test_warm_start_is_the_same_as_observing() -> None:
    trace = [3.0, 5.0, 4.0, 8.0, 9.0]
    warm = make_predictor("holt", warm_start=trace)
    cold = make_predictor("holt")
    for value in trace:
        cold.observe(value)
    assert warm.predict() == cold.predict()


def test_bad_names_and_parameters_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown predictor 'kalman'"):
        make_predictor("kalman")
    with pytest.raises(ValueError, match="alpha"):
        make_predictor("holt", alpha=0.0)
    with pytest.raises(ValueError, match="window"):
        make_predictor("moving_average", window=0)
    with pytest.raises(ValueError, match="season"):
        make_predictor("holt_winters", season=1)
    with pytest.raises(ValueError, match="gamma"):
        make_predictor("holt_winters", gamma=1.5)
    for kind in ("holt", "holt_winters"):
        with pytest.raises(ValueError, match="phi"):
            make_predictor(kind, phi=0.0)


def daily(days: int, season: int = 12) -> list[float]:
    """A rate with a daily shape (peak 18, trough 2) on a slow upward trend."""
    return [10.0 + 8.0 * math.sin(2 * math.pi * i / season) + 0.05 * i for i in range(days * season)]


def test_holt_winters_follows_a_season_that_holt_misses() -> None:
    series = daily(6)
    history, future = series[:60], series[60:]
    models = {kind: make_predictor(kind, alpha=0.3, beta=0.1, gamma=0.3, season=12, warm_start=history)
              for kind in ("holt", "holt_winters")}
    errors = dict.fromkeys(models, 0.0)
    for value in future:
        for kind, model in models.items():
            errors[kind] += abs(model.predict() - value)
            model.observe(value)
    assert errors["holt_winters"] / len(future) < 0.5, errors
    assert errors["holt_winters"] * 5 < errors["holt"], errors


def test_holt_winters_forecasts_the_mean_until_it_has_seen_a_season() -> None:
    predictor = make_predictor("holt_winters", season=4, warm_start=[2.0, 6.0])
    assert predictor.predict() == pytest.approx(4.0)
    for value in (2.0, 6.0):  # one season seen: 2, 6, 2, 6
        predictor.observe(value)
    assert predictor.predict() == pytest.approx(2.0)


def test_a_trace_warm_starts_the_rate_forecast(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    # 60 requests in the first minute, 120 in the second.
    stamps = [i * 1000.0 for i in range(60)] + [60_000 + i * 500.0 for i in range(120)]
    lines = (json.dumps({"timestamp": t, "input_length": 10, "output_length": 2}) for t in stamps)
    trace.write_text("\n".join(lines) + "\n")
    assert trace_rates(trace, 60.0) == [1.0, 2.0]
    assert trace_rates(trace, 60.0, time_scale=2.0) == [3.0]
    config = build_config({
        "model": "m", "intervals": {"throughput_s": 60},
        "predictor": {"kind": "constant", "warm_start_trace": str(trace), "warm_start": [5.0]},
    })
    state = PlanningState(config, Decider(config))
    assert state.rate_predictor.predict() == 5.0  # the trace's rates, then warm_start
    config = build_config({"model": "m", "predictor": {"kind": "constant", "warm_start_trace": str(trace)},
                           "intervals": {"throughput_s": 60}})
    assert PlanningState(config, Decider(config)).rate_predictor.predict() == 2.0
    trace.write_text("not json\n")
    with pytest.raises(ValueError, match="not a trace request"):
        trace_rates(trace, 60.0)


def test_the_floor_is_the_forecast_for_when_a_replica_asked_for_now_serves() -> None:
    from dynamo.planner.decide import RoleState
    from dynamo.planner.observe import FrontendWindow
    from dynamo.planner.profile import PerformanceModel, Profile

    points = [{"isl": 128, "concurrency": c, "ttft_ms": 100.0 * c, "itl_ms": 10.0 * c, "throughput_rps": float(c)}
              for c in (1, 2, 4, 8, 16)]
    config = build_config({"model": "m", "targets": {"ttft": {"ms": 500}, "itl": {"ms": 50}},
                           "roles": {"agg": {"max_replicas": 20}}, "intervals": {"throughput_s": 20, "load_s": 10},
                           "predictor": {"kind": "holt", "alpha": 0.5, "beta": 0.3}})
    state = PlanningState(config, Decider(config, PerformanceModel(Profile.model_validate({"points": points}))))

    def window(rate: float) -> FrontendWindow:
        return FrontendWindow(seconds=20.0, request_rate=rate, inflight=0, isl=128.0, osl=None,
                              ttft_ms=None, itl_ms=None)

    # A replica seen starting at 0 s and ready at 40 s: the start-up is 40 s.
    state.note_fleet({"agg": RoleState(ready=1)}, -10.0)
    state.note_fleet({"agg": RoleState(ready=1, pending=1)}, 0.0)
    state.note_fleet({"agg": RoleState(ready=1, pending=1)}, 20.0)
    state.note_fleet({"agg": RoleState(ready=2)}, 40.0)
    assert state.startup_s == 40.0
    # Demand rising 2 req/s an interval: the floor is set for three intervals ahead
    # (the next, plus 40 s of start-up), not the next one alone.
    for rate in (10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 22.0, 24.0):
        state.windows = [window(rate)]
        [decision] = state.throughput_step({"agg": RoleState(ready=2)})
    next_one, ahead = state.rate_predictor.predict(), state.rate_predictor.predict(3.0)
    assert ahead > next_one + 3.0
    assert f"forecast {ahead:.2f} req/s" in decision.reason, (decision, next_one, ahead)
    assert decision.target == math.ceil(ahead / 5.0), decision


def test_the_start_up_counts_from_the_ask_not_from_the_pass_that_sees_it_starting() -> None:
    from dynamo.planner.decide import RoleState
    from dynamo.planner.observe import FrontendWindow
    from dynamo.planner.profile import PerformanceModel, Profile

    points = [{"isl": 128, "concurrency": c, "ttft_ms": 100.0 * c, "itl_ms": 10.0 * c, "throughput_rps": float(c)}
              for c in (1, 2, 4, 8, 16)]
    config = build_config({"model": "m", "targets": {"ttft": {"ms": 500}, "itl": {"ms": 50}},
                           "roles": {"agg": {"max_replicas": 20}}, "intervals": {"throughput_s": 20, "load_s": 10},
                           "expected_startup_s": 5})
    state = PlanningState(config, Decider(config, PerformanceModel(Profile.model_validate({"points": points}))))
    state.note_fleet({"agg": RoleState(ready=1)}, 0.0)
    state.windows = [FrontendWindow(seconds=20.0, request_rate=15.0, inflight=0, isl=128.0, osl=None,
                                    ttft_ms=None, itl_ms=None)]
    [decision] = state.throughput_step({"agg": RoleState(ready=1)})
    assert decision.change > 0, decision
    # Asked for at 0 s, first seen starting at the next pass (10 s), ready at 30 s.
    state.note_fleet({"agg": RoleState(ready=1, pending=decision.change)}, 10.0)
    state.note_fleet({"agg": RoleState(ready=decision.target)}, 30.0)
    assert state.startup_s == 30.0
    # A replica this planner did not ask for (another actor's restart) counts from the
    # pass that first saw it starting.
    state.note_fleet({"agg": RoleState(ready=decision.target, pending=1)}, 100.0)
    state.note_fleet({"agg": RoleState(ready=decision.target + 1)}, 140.0)
    assert state.startup_s == 40.0


def test_a_warm_start_that_is_not_whole_seasons_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    def state(warm: list[float]) -> PlanningState:
        config = build_config({"model": "m", "predictor": {"kind": "holt_winters", "season": 4, "warm_start": warm}})
        return PlanningState(config, Decider(config))

    with caplog.at_level("WARNING", logger="dynamo.planner"):
        state([1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0])
        assert not caplog.records
        shifted = state([1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0])
    assert "holds 7 intervals, not whole seasons of 4" in caplog.text
    # Shifted indeed: the next forecast is the season's last term, not its first.
    assert shifted.rate_predictor.predict() == pytest.approx(4.0)


def test_before_any_start_is_seen_the_configured_start_up_sets_how_far_ahead() -> None:
    from dynamo.planner.decide import RoleState
    from dynamo.planner.step import expected_startup_s

    base = {"model": "m", "roles": {"agg": {"max_replicas": 20}}, "intervals": {"throughput_s": 20, "load_s": 10}}
    assert expected_startup_s(build_config(base)) == 0.0
    local = build_config({**base, "connector": {"kind": "local", "startup_delay_s": 25}})
    assert expected_startup_s(local) == 25.0
    # Set, it wins over the connector's delay (which a process only adds to).
    both = build_config({**base, "expected_startup_s": 40, "connector": {"kind": "local", "startup_delay_s": 25}})
    assert expected_startup_s(both) == 40.0
    state = PlanningState(local, Decider(local))
    assert state.startup_s == 25.0
    # Once a start is seen, what was seen replaces the estimate.
    state.note_fleet({"agg": RoleState(ready=1, pending=1)}, 0.0)
    state.note_fleet({"agg": RoleState(ready=2)}, 50.0)
    assert state.startup_s == 50.0


def test_a_load_pass_with_a_throughput_pass_due_judges_the_fleet_against_the_new_floor() -> None:
    from dynamo.planner.decide import RoleState
    from dynamo.planner.observe import FrontendWindow
    from dynamo.planner.profile import PerformanceModel, Profile

    # One replica serves c req/s at concurrency c, 100c ms TTFT and 10c ms ITL: 5 req/s
    # within 500 ms and 50 ms, 4 req/s within 80 % of them.
    points = [{"isl": 128, "concurrency": c, "ttft_ms": 100.0 * c, "itl_ms": 10.0 * c, "throughput_rps": float(c)}
              for c in (1, 2, 4, 8, 16)]
    config = build_config({"model": "m", "targets": {"ttft": {"ms": 500}, "itl": {"ms": 50}},
                           "roles": {"agg": {"max_replicas": 20}}, "intervals": {"throughput_s": 20, "load_s": 10},
                           "predictor": {"kind": "constant"}})

    def window(rate: float, ttft_ms: float, itl_ms: float) -> FrontendWindow:
        # Each request takes 1 s on the profile: as many in flight as arrive a second.
        return FrontendWindow(seconds=10.0, request_rate=rate, inflight=int(rate), isl=128.0, osl=None,
                              ttft_ms=ttft_ms, itl_ms=itl_ms)

    def passes(throughput_first: bool) -> list[tuple[str, str, int]]:
        state = PlanningState(config, Decider(config, PerformanceModel(Profile.model_validate({"points": points}))))
        fleet = {"agg": RoleState(ready=3)}
        state.note_fleet(fleet, 0.0)
        # 15 req/s on 3 replicas (5 each: at the targets), then a quiet window of 6 req/s
        # that 2 replicas would carry within 80 % of them; the throughput pass at 20 s
        # forecasts the two windows' 10.5 req/s: a floor of 3.
        [first] = state.load_step(window(15.0, 500.0, 50.0), fleet, {"agg": 0}, (), 10.0)
        assert first.action == "hold", first
        quiet = window(6.0, 200.0, 20.0)
        if throughput_first:
            decisions = state.load_step(quiet, fleet, {"agg": 0}, (), 20.0, throughput=True)
        else:  # the load pass, then the throughput pass, at the same instant
            [load] = state.load_step(quiet, fleet, {"agg": 0}, (), 20.0)
            after = {"agg": RoleState(ready=3 + min(load.change, 0))}
            decisions = [load, *state.throughput_step(after)]
        return [(d.loop, d.action, d.target) for d in decisions]

    # Judged against the floor the pass sets at the same instant: nothing moves.
    assert passes(throughput_first=True) == [("throughput", "hold", 3), ("load", "hold", 3)]
    # The other order drains a replica and starts another at once.
    assert passes(throughput_first=False) == [("load", "down", 2), ("throughput", "up", 3)]

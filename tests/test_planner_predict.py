"""Demand forecasts: each model on the series it is for, and warm starts."""

from __future__ import annotations

import pytest
from dynamo.planner.predict import make_predictor


@pytest.mark.parametrize("kind", ["constant", "moving_average", "holt"])
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

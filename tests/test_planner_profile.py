"""The performance model: interpolating a profile to a replica's capacity at the targets,
and the live correction that leaves warm-up samples out."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from dynamo.planner.profile import (
    DisaggModel,
    LiveCorrection,
    PerformanceModel,
    Profile,
    ProfileError,
    ProfilePoint,
    Sample,
    erlang_c,
    load_profile,
)
from planner_helpers import saturating_profile


def grid() -> Profile:
    """Two input lengths; latency grows linearly with concurrency, twice as fast at 1024."""
    points = []
    for isl, slope in ((128, 1.0), (1024, 2.0)):
        for c in (1, 2, 4, 8):
            points.append({"isl": isl, "concurrency": c, "ttft_ms": 100 * slope * c, "itl_ms": 10 * slope * c,
                           "throughput_rps": c / slope})
    return Profile.model_validate({"engine": "test", "points": points})


def test_capacity_interpolates_along_concurrency() -> None:
    model = PerformanceModel(grid())
    # isl 128: TTFT 300 ms is reached at concurrency 3 (between 2 and 4) -> 3 req/s.
    assert model.capacity(128, ttft_ms=300, itl_ms=None) == pytest.approx(3.0)
    # ITL is the tighter limit: 25 ms at concurrency 2.5.
    assert model.capacity(128, ttft_ms=300, itl_ms=25) == pytest.approx(2.5)
    # Looser than the whole profile: its best point; tighter than its first: nothing.
    assert model.capacity(128, ttft_ms=10_000, itl_ms=None) == pytest.approx(8.0)
    assert model.capacity(128, ttft_ms=50, itl_ms=None) == 0.0


def test_capacity_interpolates_along_input_length_and_clamps() -> None:
    model = PerformanceModel(grid())
    at_128 = model.capacity(128, 400, None)  # concurrency 4 -> 4 req/s
    at_1024 = model.capacity(1024, 400, None)  # concurrency 2 -> 1 req/s
    assert (at_128, at_1024) == (pytest.approx(4.0), pytest.approx(1.0))
    # Between the lengths along a power law through both: 4 * (576/128)^(-2/3).
    assert model.capacity(576, 400, None) == pytest.approx(4.0 * 4.5 ** (-2 / 3))
    assert model.capacity(64, 400, None) == at_128 and model.capacity(4096, 400, None) == at_1024


def test_between_lengths_a_quadratic_prefill_is_followed_not_overstated() -> None:
    """A replica whose per-request time grows with the square of the prompt (quadratic
    attention, as the mocker's timing model): capacity ~ isl^-2, TTFT ~ isl^2. The model,
    given only 2k and 32k, gives the capacity at 8k that the profile would measure
    there; a straight line between the two would give 12.8x more."""
    def point(isl: int, c: int) -> dict[str, float]:
        scale = (isl / 1000) ** 2
        return {"isl": isl, "concurrency": c, "ttft_ms": 10 * scale * c, "itl_ms": 5.0 * c,
                "throughput_rps": c / scale}

    profile = Profile.model_validate({"engine": "quadratic", "points": [
        point(isl, c) for isl in (2000, 32000) for c in (1, 2, 4, 8)]})
    measured = Profile.model_validate({"engine": "quadratic", "points": [point(8000, c) for c in (1, 2, 4, 8)]})
    model = PerformanceModel(profile)
    # The ITL limit holds each replica at 4.5 requests in flight, whatever the prompt.
    want = PerformanceModel(measured).capacity(8000, None, 22.5)
    assert want == pytest.approx(4.5 / 64)
    assert model.capacity(8000, None, 22.5) == pytest.approx(want)
    assert model.latency(8000, 2) == pytest.approx(PerformanceModel(measured).latency(8000, 2))


def test_erlang_c_against_its_textbook_values() -> None:
    # Two servers at one erlang: B = 1/5, C = B / (1 - 0.5 + 0.5 B) = 1/3.
    assert erlang_c(2, 1.0) == pytest.approx(1 / 3)
    assert erlang_c(1, 0.7) == pytest.approx(0.7)  # one server: the utilisation
    assert erlang_c(4, 4.0) == 1.0 and erlang_c(4, 5.0) == 1.0  # cannot keep up
    # Large fleets stay finite (the recurrence never forms c!).
    assert 0.0 < erlang_c(2000, 1800.0) < 1.0


def test_a_saturated_engine_queues_open_loop_arrivals_at_its_slots() -> None:
    model = PerformanceModel(saturating_profile())
    # 3 replicas: 12 slots of 2 req/s. At 20 req/s C(12, 10) = 0.449 and the p90 wait is
    # ln(4.49) / (24 - 20) = 0.376 s, beside the 50 ms of a replica with its slots full.
    full, wait = model.slot_wait(128, 20.0, 3, 0.9)
    assert full == pytest.approx(50.0)
    assert wait == pytest.approx(1000 * math.log(erlang_c(12, 10.0) / 0.1) / 4) and wait == pytest.approx(376, abs=1)
    # Fewer than one arrival in ten waits: no wait at the quantile.
    assert model.slot_wait(128, 10.0, 4, 0.9) == (pytest.approx(50.0), 0.0)
    assert model.slot_wait(128, 0.0, 3, 0.9) == (pytest.approx(50.0), 0.0)
    assert model.slot_wait(128, 24.0, 3, 0.9)[1] == math.inf
    # A sweep whose throughput still grows at its last point says nothing of slots.
    assert PerformanceModel(saturating_profile(last_rps=8.8)).slot_wait(128, 20.0, 3, 0.9) is None
    assert PerformanceModel(grid()).slot_wait(128, 20.0, 3, 0.9) is None


def test_latency_between_points() -> None:
    ttft, itl = PerformanceModel(grid()).latency(128, 3)
    assert (ttft, itl) == (pytest.approx(300), pytest.approx(30))


def test_live_correction_scales_latency_and_capacity() -> None:
    model = PerformanceModel(grid(), LiveCorrection(warmup_s=30, smoothing=1.0))
    # The fleet runs twice as slow as profiled.
    assert model.correct(Sample(isl=128, concurrency=2, ttft_ms=400, itl_ms=40, youngest_worker_age_s=60))
    assert model.correction.ttft_factor == pytest.approx(2.0)
    assert model.latency(128, 2) == (pytest.approx(400), pytest.approx(40))
    assert model.capacity(128, 400, None) == pytest.approx(2.0)


def test_warm_up_samples_do_not_move_the_model() -> None:
    model = PerformanceModel(grid(), LiveCorrection(warmup_s=30, smoothing=0.5))
    # A worker 5 s old: its first passes are ten times slower; left out.
    slow = Sample(isl=128, concurrency=2, ttft_ms=2000, itl_ms=200, youngest_worker_age_s=5)
    for _ in range(5):
        assert not model.correct(slow)
    assert (model.correction.ttft_factor, model.correction.itl_factor) == (1.0, 1.0)
    assert (model.correction.excluded_warmup, model.correction.used) == (5, 0)
    assert model.capacity(128, 300, None) == pytest.approx(3.0)
    # Once the worker is past its warm-up, samples count (and are bounded).
    assert model.correct(Sample(isl=128, concurrency=2, ttft_ms=2000, itl_ms=None, youngest_worker_age_s=31))
    assert model.correction.ttft_factor == pytest.approx(0.5 + 0.5 * 4.0)


def test_backlog_samples_do_not_move_the_model() -> None:
    model = PerformanceModel(grid(), LiveCorrection(warmup_s=0, smoothing=1.0))
    # Queued requests finishing: 30 s TTFTs from a fleet holding 5 waiting per replica,
    # or 40 in flight per replica where the profile stops at 8. Both left out.
    queued = Sample(isl=128, concurrency=4, ttft_ms=30_000, itl_ms=40, youngest_worker_age_s=60, waiting=5.0)
    beyond = Sample(isl=128, concurrency=40, ttft_ms=30_000, itl_ms=40, youngest_worker_age_s=60)
    assert not model.correct(queued) and not model.correct(beyond)
    assert (model.correction.excluded_backlog, model.correction.used) == (2, 0)
    assert model.capacity(128, 300, None) == pytest.approx(3.0)
    # One waiting request per replica is no backlog: the sample counts.
    assert model.correct(Sample(isl=128, concurrency=2, ttft_ms=400, itl_ms=40, youngest_worker_age_s=60, waiting=1.0))
    assert model.correction.ttft_factor == pytest.approx(2.0)


def test_load_profile_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    grid().save(path)
    assert load_profile(path) == grid()
    path.write_text(json.dumps({"points": [{"isl": 1, "concurrency": 1, "ttft_ms": "x", "itl_ms": 1,
                                            "throughput_rps": 1}]}))
    with pytest.raises(ProfileError, match="ttft_ms"):
        load_profile(path)
    path.write_text("{")
    with pytest.raises(ProfileError, match="not a usable profile"):
        load_profile(path)
    with pytest.raises(ProfileError):
        load_profile(tmp_path / "missing.json")


def test_the_disaggregated_model_answers_each_role_from_its_own_profile() -> None:
    def profile(points: list[tuple[int, float, float, float]]) -> Profile:
        return Profile(points=[ProfilePoint(isl=1000, concurrency=c, ttft_ms=t, itl_ms=i, throughput_rps=r)
                               for c, t, i, r in points])

    # A prefill replica: 4 req/s within 500 ms TTFT, 8 beyond. A decode replica: 10 req/s
    # within 20 ms ITL, 20 within 40 ms.
    prefill = profile([(1, 100.0, 0.0, 2.0), (2, 400.0, 0.0, 4.0), (4, 900.0, 0.0, 8.0)])
    decode = profile([(1, 5.0, 10.0, 5.0), (2, 5.0, 20.0, 10.0), (4, 5.0, 40.0, 20.0)])
    model = DisaggModel(prefill, decode)
    assert model.capacity(1000, 400.0, None) == pytest.approx(4.0)
    assert model.capacity(1000, None, 20.0) == pytest.approx(10.0)
    assert model.capacity(1000, 400.0, 20.0) == pytest.approx(4.0)
    # Predicted latencies: TTFT from the prefill profile, ITL from the decode one.
    assert model.latency(1000, 2) == pytest.approx((400.0, 20.0))
    # One live correction for both: a slower decode than profiled halves its capacity.
    model.correction.itl_factor = 2.0
    assert model.capacity(1000, None, 40.0) == pytest.approx(10.0)
    assert model.capacity(1000, 400.0, None) == pytest.approx(4.0)

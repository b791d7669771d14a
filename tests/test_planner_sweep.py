"""`python -m dynamo.planner.profile --mocker`: a small sweep of a real mocker, written
as a profile the planner's model loads and interpolates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dynamo.planner.profile import PerformanceModel, load_profile
from dynamo.planner.sweep import prompt_of, quantile
from llm_helpers import write_json


@pytest.mark.timeout(120)
def test_a_mocker_sweep_is_a_usable_profile(tmp_path: Path) -> None:
    settings = write_json(tmp_path / "mocker.json", {"speedup_ratio": 4.0})
    output = tmp_path / "profile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.planner.profile", "--mocker", "--extra-engine-args", str(settings),
         "--isl", "64,256", "--concurrency", "1,4", "--osl", "16", "--rounds", "3", "--output", str(output)],
        capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    profile = load_profile(output)
    assert profile.engine == "mocker" and profile.osl == 16
    assert sorted((p.isl, p.concurrency) for p in profile.points) == [(64, 1), (64, 4), (256, 1), (256, 4)]
    for isl in (64, 256):
        one, four = profile.curve(isl)
        assert one.ttft_ms > 0 and one.itl_ms > 0
        # The engine batches: four clients get through more than one does.
        assert four.throughput_rps > one.throughput_rps
    model = PerformanceModel(profile)
    # Between the lengths along a power law: at 128, halfway between 64 and 256 on a log
    # axis, the geometric mean of their capacities.
    at_64, at_256 = profile.curve(64)[1].throughput_rps, profile.curve(256)[1].throughput_rps
    assert model.capacity(128, ttft_ms=10_000, itl_ms=10_000) == pytest.approx((at_64 * at_256) ** 0.5)


def test_a_prefill_and_a_decode_worker_are_profiled_for_their_own_work(tmp_path: Path) -> None:
    """``--role prefill``: one-token requests, the prefill's TTFT. ``--role decode``: the
    prompts arrive cached (the mocker's prefix cache), so the TTFT is a decode step's,
    far under the prefill's, and the ITL is measured as for an aggregated worker."""
    settings = write_json(tmp_path / "mocker.json", {"speedup_ratio": 4.0})
    profiles = {}
    for role in ("agg", "prefill", "decode"):
        output = tmp_path / f"{role}.json"
        proc = subprocess.run(
            [sys.executable, "-m", "dynamo.planner.profile", "--mocker", "--extra-engine-args", str(settings),
             "--role", role, "--isl", "2048", "--concurrency", "1", "--osl", "16", "--rounds", "3",
             "--output", str(output)],
            capture_output=True, text=True, timeout=100,
        )
        assert proc.returncode == 0, proc.stderr + proc.stdout
        profiles[role] = load_profile(output)
    assert {role: (p.role, p.osl) for role, p in profiles.items()} == {
        "agg": ("agg", 16), "prefill": ("prefill", 1), "decode": ("decode", 16)}
    agg, prefill, decode = (profiles[role].points[0] for role in ("agg", "prefill", "decode"))
    assert prefill.itl_ms == 0 and prefill.ttft_ms > 0
    assert decode.ttft_ms < agg.ttft_ms / 2, (decode, agg)
    assert decode.itl_ms > 0 and agg.itl_ms > 0
    # A prefill worker finishes a request at its first token: more requests a second.
    assert prefill.throughput_rps > agg.throughput_rps


def test_a_failing_sweep_says_why(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.planner.profile", "--url", "http://127.0.0.1:1", "--isl", "8",
         "--concurrency", "1", "--rounds", "2", "--output", str(tmp_path / "p.json")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 1 and "the probe request that sizes prompts failed" in proc.stderr, proc.stderr
    assert "ConnectionRefusedError" in proc.stderr, proc.stderr
    assert not (tmp_path / "p.json").exists()


def test_prompts_and_quantiles() -> None:
    import random

    assert len(prompt_of(100, random.Random(0))) == 100
    # Sized for a tokenizer that makes a token of 2.5 characters of such words.
    assert len(prompt_of(100, random.Random(0), 2.5)) == 250
    assert quantile([4.0, 1.0, 3.0, 2.0], 0.5) == pytest.approx(2.5)
    assert quantile([5.0], 0.9) == 5.0

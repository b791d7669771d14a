"""Profiles shared by the planner's tests."""

from __future__ import annotations

from dynamo.planner.profile import Profile

ISL = 128


def saturating_profile(last_rps: float = 8.0) -> Profile:
    """A replica whose engine runs 4 requests at a time: 8 req/s from concurrency 4 on,
    and a closed-loop TTFT that grows only by the requests queued behind those 4.
    ``last_rps``: the throughput measured at 16 in flight (over 8 · 1.05, the sweep shows
    no saturation: it seems to have stopped short of it)."""
    points = [
        {"isl": ISL, "concurrency": c, "ttft_ms": 50.0 + 125.0 * max(0, c - 4), "itl_ms": 20.0,
         "throughput_rps": last_rps if c == 16 else 2.0 * min(c, 4)}
        for c in (1, 2, 4, 8, 16)
    ]
    return Profile.model_validate({"points": points})

"""The simulated engine: a fleet of it on a virtual clock (``dynamo._core.PlannerLab``)
and the performance profile of one replica of it (``planner_lab_point``), cached."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from dynamo._core import PlannerLab, planner_lab_point
from dynamo.planner.lab.settings import Settings
from dynamo.planner.lab.workload import Workload
from dynamo.planner.profile import Profile, ProfilePoint

#: A fixed fleet: replicas (aggregated), or replicas per role (disaggregated).
Fleet = int | Mapping[str, int]
#: Concurrencies of the profile sweep.
PROFILE_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)


def simulated_fleet(workload: Workload, replicas: Fleet, settings: Settings) -> PlannerLab:
    """A fresh simulated fleet of ``replicas`` warm replicas (a count per role when
    disaggregated) that replays ``workload``."""
    pools: dict[str, Any] = {}
    if isinstance(replicas, int):
        pools["replicas"] = replicas
    else:
        pools.update(prefill_replicas=replicas["prefill"], decode_replicas=replicas["decode"])
        if settings.max_local_prefill_length is not None:
            pools["max_local_prefill_length"] = settings.max_local_prefill_length
    return PlannerLab(
        str(workload.trace) if workload.trace else None, workload.requests, **pools,
        trace_block_size=settings.trace_block_size, time_scale=workload.time_scale,
        startup_s=settings.startup_s, warmup_s=settings.warmup_s, warmup_factor=settings.warmup_factor,
        seed=settings.seed, engine_args=settings.engine_args, busy_threshold=settings.busy_threshold,
        busy_wait_s=settings.busy_wait_s,
    )


def profile_for(workload: Workload, settings: Settings, role: str = "agg") -> Profile:
    """The performance profile of one simulated replica of ``role`` over the workload's
    input lengths (its 10th, 50th and 90th percentiles) and mean output length, cached
    on disk (``planner_lab_point``: a prefill replica's requests are one token long, a
    decode replica's prompts arrive cached)."""
    _, _, osl, isls = workload.shape()
    ordered = sorted(isls)
    lengths = sorted({max(16, ordered[int(q * (len(ordered) - 1))]) for q in (0.1, 0.5, 0.9)})
    osl_i = max(2, round(osl))
    q = settings.config.targets.ttft.quantile
    parts: list[Any] = [1, settings.engine_args, lengths, osl_i, q, PROFILE_CONCURRENCY]
    if role != "agg":  # the aggregated profile's key as it was, so its cache entries stay valid
        parts.append(role)
    key = json.dumps(parts, sort_keys=True)
    cache = settings.cache_dir / f"profile-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json" \
        if settings.cache_dir else None
    if cache is not None and cache.exists():
        try:
            return Profile.model_validate_json(cache.read_text())
        except ValueError:
            pass  # a stale or broken cache entry: measure again
    points = []
    for isl in lengths:
        for c in PROFILE_CONCURRENCY:
            p = planner_lab_point(
                isl, osl_i, c, max(4 * c, 24), quantile=q, engine_args=settings.engine_args, role=role
            )
            points.append(ProfilePoint(isl=isl, concurrency=c, ttft_ms=p["ttft_ms"], itl_ms=p["itl_ms"],
                                       throughput_rps=p["throughput_rps"]))
    engine = "planner-lab mocker" if role == "agg" else f"planner-lab mocker, {role} replica"
    profile = Profile(engine=engine, role=role, quantile=q, osl=1 if role == "prefill" else osl_i, points=points)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        profile.save(cache)
    return profile


def profiles_for(workload: Workload, settings: Settings) -> dict[str, Profile]:
    """Each pool's profile: ``agg``'s, or ``prefill``'s and ``decode``'s."""
    return {role: profile_for(workload, settings, role) for role in settings.roles}

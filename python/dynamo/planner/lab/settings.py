"""The lab's knobs (``Settings``, from its command line) and its cache directory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dynamo.planner.config import ROLES_AGG, ROLES_DISAGG, PlannerConfig


@dataclass
class Settings:
    """The lab's knobs (its command line)."""

    config: PlannerConfig
    startup_s: float = 30.0
    warmup_s: float = 10.0
    warmup_factor: float = 2.0
    seed: int = 0
    trace_block_size: int = 512
    engine_args: str | None = None
    cache_dir: Path | None = None
    #: Replicas ``load-only`` and ``planner`` start with (default: ``min_replicas``, at least 1).
    initial_replicas: int | None = None
    #: The router's busy threshold: arrivals wait at the frontend while every ready
    #: replica's KV demand is at or over this fraction (``None``: they queue on a replica).
    busy_threshold: float | None = None
    #: The frontend's busy wait: an arrival held that many seconds is refused (``None``:
    #: held without a bound).
    busy_wait_s: float | None = None
    #: Disaggregated: a decode replica prefills remotely only a prompt whose uncached part
    #: is longer than this (``None``: the decode worker's default, 1000 tokens).
    max_local_prefill_length: int | None = None

    @property
    def ttft_ms(self) -> float:
        return self.config.targets.ttft.ms

    @property
    def itl_ms(self) -> float:
        return self.config.targets.itl.ms

    @property
    def max_replicas(self) -> int:
        return self.config.roles["agg"].max_replicas

    @property
    def disagg(self) -> bool:
        """Whether the roles are ``prefill`` and ``decode``."""
        return "agg" not in self.config.roles

    @property
    def roles(self) -> tuple[str, ...]:
        """``("agg",)`` or ``("prefill", "decode")``."""
        return ROLES_DISAGG if self.disagg else ROLES_AGG

    @property
    def min_fleet(self) -> int:
        """The replicas of every role at its ``min_replicas``."""
        return sum(self.config.roles[role].min_replicas for role in self.roles)

    def gpus(self, fleet: Mapping[str, int]) -> float:
        """GPUs a fleet of ``fleet`` replicas per role holds."""
        return sum(n * self.config.roles[role].gpus_per_replica for role, n in fleet.items())


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dynamo" / "planner-lab"

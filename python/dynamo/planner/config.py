"""The planner's configuration: a YAML file validated by pydantic, with command-line flags
overriding it (docs/planner.md, "Configuration").

A wrong key or a value of the wrong type is a `PlannerConfigError` whose message names
every offending key by its dotted path (``targets.ttft.ms``), never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: The roles a planner sizes: one aggregated pool, or prefill and decode pools.
ROLES_AGG = ("agg",)
ROLES_DISAGG = ("prefill", "decode")


class PlannerConfigError(ValueError):
    """The configuration cannot be used; the message names each bad key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Target(_Strict):
    """A latency target: the ``quantile`` of the latency must stay at or under ``ms``."""

    quantile: float = Field(default=0.9, gt=0.0, lt=1.0)
    ms: float = Field(gt=0.0)


class Targets(_Strict):
    """The service-level targets: time to first token and inter-token latency."""

    ttft: Target = Target(quantile=0.9, ms=500.0)
    itl: Target = Target(quantile=0.9, ms=50.0)


class RoleConfig(_Strict):
    """One pool of identical workers the planner sizes."""

    min_replicas: int = Field(default=1, ge=0)
    max_replicas: int = Field(default=8, ge=1)
    gpus_per_replica: float = Field(default=1.0, ge=0.0)
    #: ``namespace.component.endpoint`` the workers serve (their load reports arrive on the
    #: component's ``load_metrics`` subject).
    endpoint: str = "dynamo.mocker.generate"
    #: ``local`` connector: the command that starts one worker.
    command: list[str] = Field(default_factory=list)
    #: ``kubernetes`` connector: the ``dynamo.ai/service`` label of the role's Deployment.
    service: str | None = None
    #: A JSON profile of one worker of this role (``python -m dynamo.planner.profile
    #: --role``); default: the top-level ``profile``.
    profile: Path | None = None

    @model_validator(mode="after")
    def _bounds(self) -> RoleConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) is above max_replicas ({self.max_replicas})")
        return self


class Intervals(_Strict):
    """Seconds between two passes of each loop."""

    #: The predictive loop: forecast demand, set each role's replica floor.
    throughput_s: float = Field(default=60.0, gt=0.0)
    #: The reactive loop: ±1 replica when the observed quantiles cross the targets.
    load_s: float = Field(default=10.0, gt=0.0)
    #: The urgent check between load passes: the workers' waiting requests (their load
    #: reports, already in memory) against the ready replicas; a backlog that the fleet
    #: cannot serve scales up at once instead of at the next load pass. ``None``: off.
    urgent_s: float | None = Field(default=1.0, gt=0.0)


class PredictorConfig(_Strict):
    """How demand is forecast (docs/planner.md, "Predict")."""

    kind: Literal["constant", "moving_average", "holt", "holt_winters"] = "holt"
    window: int = Field(default=6, ge=1)
    alpha: float = Field(default=0.5, gt=0.0, le=1.0)
    beta: float = Field(default=0.3, ge=0.0, le=1.0)
    #: ``holt_winters``: the seasonal term's smoothing and the season, in throughput intervals.
    gamma: float = Field(default=0.3, ge=0.0, le=1.0)
    season: int = Field(default=24, ge=2)
    #: ``holt``, ``holt_winters``: the trend's damping, in (0, 1]; 1 carries a trend on
    #: forever, under 1 a forecast adds at most ``phi / (1 - phi)`` intervals of trend.
    phi: float = Field(default=1.0, gt=0.0, le=1.0)
    #: Past request rates (req/s, one per throughput interval) that warm the model up.
    warm_start: list[float] = Field(default_factory=list)
    #: A Mooncake-format trace whose per-interval request rates warm the model up
    #: (before ``warm_start``).
    warm_start_trace: Path | None = None


class LocalConnectorConfig(_Strict):
    """Start and stop worker processes on this machine."""

    kind: Literal["local"] = "local"
    #: Seconds to wait before starting a process (to emulate slow starts in experiments).
    startup_delay_s: float = Field(default=0.0, ge=0.0)
    #: Seconds a stopped worker gets to drain after SIGTERM before SIGKILL (``None``: its
    #: own drain bound, ``DYN_SHUTDOWN_TIMEOUT`` of its environment, plus 10 s, in which it
    #: ends the streams still running for migration and exits by itself).
    stop_timeout_s: float | None = Field(default=None, gt=0.0)
    #: Seconds a started worker gets to answer ``/ready``; one that does not stays pending.
    ready_timeout_s: float = Field(default=600.0, gt=0.0)
    #: Added to every worker's environment.
    env: dict[str, str] = Field(default_factory=dict)


class VirtualConnectorConfig(_Strict):
    """Publish decisions in discovery for an external actor (docs/planner.md, "virtual")."""

    kind: Literal["virtual"] = "virtual"
    #: Discovery key prefix of the decisions and reports.
    prefix: str = "v1/planner"
    #: Seconds to wait for the actor's report before the decision counts as not done.
    report_timeout_s: float = Field(default=60.0, gt=0.0)


class KubernetesConnectorConfig(_Strict):
    """Set ``replicas`` of the rendered Deployments through the scale subresource."""

    kind: Literal["kubernetes"] = "kubernetes"
    #: Kubernetes namespace; default: the kubeconfig context's (or the pod's) namespace.
    namespace: str | None = None
    #: The ``dynamo.ai/graph`` label of the Deployments.
    graph: str


ConnectorConfig = Annotated[
    LocalConnectorConfig | VirtualConnectorConfig | KubernetesConnectorConfig, Field(discriminator="kind")
]


class PlannerConfig(_Strict):
    """Everything ``python -m dynamo.planner`` needs."""

    #: The model name the frontend serves (its metrics' ``model`` label).
    model: str
    #: The frontend's Prometheus endpoint.
    frontend_metrics_url: str = "http://127.0.0.1:8000/metrics"
    targets: Targets = Targets()
    #: Most GPUs all roles together may hold; ``None``: no budget.
    gpu_budget: float | None = Field(default=None, gt=0.0)
    roles: dict[str, RoleConfig] = Field(default_factory=lambda: {"agg": RoleConfig()})
    intervals: Intervals = Intervals()
    predictor: PredictorConfig = PredictorConfig()
    #: A JSON profile (``python -m dynamo.planner.profile``), for every role without its
    #: own (``roles.<role>.profile``); without any the load loop alone sizes the fleet
    #: from observed latencies.
    profile: Path | None = None
    #: Log and publish decisions without acting on them.
    advisory: bool = False
    #: Allow ``min_replicas: 0``.
    scale_to_zero: bool = False
    #: Seconds a started replica is assumed to take to become ready until the planner has
    #: seen one start (then it uses what it saw): how far ahead the throughput loop
    #: forecasts. ``None``: the local connector's ``startup_delay_s``, else 0.
    expected_startup_s: float | None = Field(default=None, ge=0.0)
    #: Seconds after a worker becomes ready during which its latencies do not correct the model.
    warmup_s: float = Field(default=30.0, ge=0.0)
    #: A new replica's speed during its warm-up, as a fraction of its full speed: a
    #: scale-up for a backlog counts each replica it adds at this much capacity.
    warmup_speed: float = Field(default=1.0, gt=0.0, le=1.0)
    #: Seconds after which a signal not refreshed counts as stale.
    stale_after_s: float = Field(default=5.0, gt=0.0)
    #: Scale down only when the fleet with one replica fewer is predicted to stay this
    #: far under the targets (0.2: under 80 % of each target). The band between this and
    #: the targets is the hysteresis that keeps constant load from flapping.
    scale_down_margin: float = Field(default=0.2, ge=0.0, lt=1.0)
    #: Consecutive load passes in which one replica fewer fits before a serving replica
    #: is removed (a starting one goes at the first). Above 1 it rides out a quiet window between two busy ones, at
    #: the cost of GPU time (the lab's ramp: 1.27 GPU-hours at 1, 1.79 at 3, same attainment).
    scale_down_windows: int = Field(default=1, ge=1)
    #: Consecutive load passes with an observed quantile over its target before the load
    #: loop adds a replica for it (a backlog that the profile sizes acts at once). Above 1
    #: it rides out one slow window of a few long requests, at one load interval of reaction.
    scale_up_windows: int = Field(default=1, ge=1)
    #: Port of the planner's own ``/health`` and ``/metrics``; 0 picks a free one.
    port: int = Field(default=0, ge=0, le=65535)
    connector: ConnectorConfig = LocalConnectorConfig()

    @model_validator(mode="after")
    def _check(self) -> PlannerConfig:
        names = tuple(sorted(self.roles))
        if names not in (ROLES_AGG, tuple(sorted(ROLES_DISAGG))):
            raise ValueError(f"roles must be 'agg', or 'prefill' and 'decode' (got {', '.join(names) or 'none'})")
        for name, role in self.roles.items():
            if role.min_replicas == 0 and not self.scale_to_zero:
                raise ValueError(f"roles.{name}.min_replicas is 0 but scale_to_zero is false")
        profiled = [name for name, role in self.roles.items() if (role.profile or self.profile) is not None]
        if profiled and len(profiled) < len(self.roles):
            bare = ", ".join(f"roles.{name}.profile" for name in self.roles if name not in profiled)
            raise ValueError(f"{bare} is not set and there is no top-level profile: every role or none has one")
        if self.gpu_budget is not None:
            least = sum(r.min_replicas * r.gpus_per_replica for r in self.roles.values())
            if least > self.gpu_budget:
                raise ValueError(f"the minimum fleet needs {least:g} GPUs, over gpu_budget ({self.gpu_budget:g})")
        return self


def _where(loc: tuple[Any, ...]) -> str:
    # A discriminated union adds the tag ("local") to the path; it names no key.
    return ".".join(str(p) for p in loc if p not in ("local", "virtual", "kubernetes")) or "(top level)"


def _explain(error: ValidationError) -> str:
    lines = []
    for e in error.errors():
        got = f" (got {e['input']!r})" if e["type"] not in ("missing", "value_error") else ""
        lines.append(f"  {_where(e['loc'])}: {e['msg']}{got}")
    return "invalid planner configuration:\n" + "\n".join(lines)


def set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set ``data["a"]["b"] = value`` for ``"a.b"``, creating the tables on the way."""
    *parents, last = dotted.split(".")
    node = data
    for key in parents:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        if not isinstance(child, dict):
            raise PlannerConfigError(f"{dotted}: '{key}' is not a table")
        node = child
    node[last] = value


def build_config(data: dict[str, Any], overrides: dict[str, Any] | None = None) -> PlannerConfig:
    """Validate ``data`` (the YAML's mapping) with ``overrides`` (dotted key → value) on top.

    Raises:
        PlannerConfigError: a key is unknown, missing or of the wrong type.
    """
    merged: dict[str, Any] = yaml.safe_load(yaml.safe_dump(data)) or {}
    for dotted, value in (overrides or {}).items():
        set_dotted(merged, dotted, value)
    try:
        return PlannerConfig.model_validate(merged)
    except ValidationError as e:
        raise PlannerConfigError(_explain(e)) from None


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> PlannerConfig:
    """The configuration of the YAML file at ``path`` (``None``: defaults) with ``overrides``.

    Raises:
        PlannerConfigError: the file is unreadable, not a mapping, or invalid.
    """
    data: Any = {}
    if path is not None:
        try:
            data = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as e:
            raise PlannerConfigError(f"{path}: {e}") from None
        if not isinstance(data, dict):
            raise PlannerConfigError(f"{path}: the planner configuration must be a mapping")
    return build_config(data, overrides)

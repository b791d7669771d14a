"""The ``@service`` decorator's settings (``ServiceArgs`` in configuration), validated.

The decorator gives the defaults; a ``ServiceArgs`` section in the configuration file
or on the command line overrides them key by key.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dynamo.sdk.lib.config import SERVICE_ARGS, ServiceConfigError

DEFAULT_NAMESPACE = "dynamo"


class DynamoArgs(BaseModel):
    """``dynamo={...}``: where the service registers."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    namespace: str = DEFAULT_NAMESPACE
    name: str | None = None
    custom_lease: dict[str, Any] | None = None
    component_type: str | None = None


class ServiceArgs(BaseModel):
    """Everything ``dynamo serve`` needs to run a service's processes."""

    model_config = ConfigDict(extra="forbid")

    dynamo: DynamoArgs = Field(default_factory=DynamoArgs)
    #: Resource requests; ``gpu`` may be fractional (processes then share a GPU).
    resources: dict[str, str | int | float] = Field(default_factory=dict)
    workers: int = Field(default=1, ge=1)
    image: str | None = None
    #: Environment variables set in this service's processes.
    envs: dict[str, str] = Field(default_factory=dict)
    #: Restart a process that exits: never (default), on-failure (non-zero status), always.
    restart: Literal["never", "on-failure", "always"] = "never"
    #: Restarts allowed per process before the graph is declared failed.
    max_restarts: int = Field(default=3, ge=0)

    @field_validator("envs", mode="before")
    @classmethod
    def _envs_as_mapping(cls, value: Any) -> Any:
        # The reference accepted a list of {name, value}; keep both shapes.
        if isinstance(value, list):
            out = {}
            for entry in value:
                if not isinstance(entry, dict) or "name" not in entry:
                    raise ValueError("envs entries must be {name: ..., value: ...}")
                out[str(entry["name"])] = str(entry.get("value", ""))
            return out
        if isinstance(value, dict):
            return {str(k): v if isinstance(v, str) else _env_text(v) for k, v in value.items()}
        return value

    @property
    def gpus(self) -> float:
        """GPUs per process (``resources.gpu``, 0 when absent)."""
        value = self.resources.get("gpu", 0)
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ServiceConfigError(f"resources.gpu must be a number, got {value!r}") from None


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate_service_args(service_name: str, values: dict[str, Any]) -> ServiceArgs:
    """``values`` as ``ServiceArgs``; a wrong key or type is an error naming the service and key."""
    try:
        return ServiceArgs.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"])
            problems.append(f"{service_name}.{SERVICE_ARGS}.{where}: {err['msg']} (got {err.get('input')!r})")
        raise ServiceConfigError("invalid service settings:\n  " + "\n  ".join(problems)) from None

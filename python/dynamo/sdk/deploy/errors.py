"""The error every deployment step raises: a kind the CLI (or a caller) can match on, and
a message that says what to change."""

from __future__ import annotations

import enum


class DeployErrorKind(enum.Enum):
    """What went wrong."""

    #: The graph or its configuration cannot be rendered (a fractional GPU, a bad name…).
    INVALID = "invalid"
    #: The artifact directory is missing, incomplete or altered.
    ARTIFACT = "artifact"
    #: The Kubernetes API refused a request or could not be reached.
    API = "api"
    #: The deployments did not become ready within the bound.
    TIMEOUT = "timeout"


class DeployError(Exception):
    """A deployment step failed; ``kind`` says which way."""

    def __init__(self, kind: DeployErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind

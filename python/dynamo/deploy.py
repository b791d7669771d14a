"""``from dynamo.deploy import BaseDeployment`` (or ``Deployment``), as design proposal 002
writes it: the plain class that holds a component's deployment facts (namespace, name,
resources, workers). The same class as ``dynamo.sdk.BaseDeployment``; ``dynamo serve``,
``dynamo build`` and ``dynamo deploy`` read it as they read ``@service``."""

from __future__ import annotations

from dynamo.sdk.deployment import BaseDeployment

#: The proposal's name for it.
Deployment = BaseDeployment

__all__ = ["BaseDeployment", "Deployment"]

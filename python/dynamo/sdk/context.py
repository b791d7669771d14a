"""``dynamo_context``: what the running process knows about itself.

The runner fills it before the service class is instantiated, so ``__init__`` and every
hook can read it: ``runtime`` (the ``DistributedRuntime``), ``namespace``, ``component``
(the service's ``Component``), ``service_name``, ``worker_id`` (this process's instance
id, unique in the deployment), ``worker_index`` (0-based index among the service's
processes under ``dynamo serve``) and ``endpoints`` (the served ``Endpoint`` objects).
"""

from __future__ import annotations

from typing import Any

dynamo_context: dict[str, Any] = {}

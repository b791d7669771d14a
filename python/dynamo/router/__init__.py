"""KV-cache-aware routing from Python: :class:`KvRouter` (choose a worker for a prompt),
the standalone router component (``python -m dynamo.router``) and the routing lab
(``python -m dynamo.router.lab``); see docs/kv-routing.md."""

from __future__ import annotations

from dynamo._core import KvRouter

__all__ = ["KvRouter"]

"""The Router: token ids in, the worker instance to send them to out.

``generate({"token_ids": [...]})`` yields one ``{"worker_id": int | None,
"prefix_hit_rate": float}``; ``worker_id`` is ``None`` when no worker is registered.
The choice is made by a routing policy (``policy`` in the Router's configuration):

- ``prefix-hash`` (default): rendezvous hashing of the prompt's first KV block
  (``kv-cache-block-size`` tokens) over the live Worker instances, so requests that
  share a first block go to the same worker (and find its cached blocks) while distinct
  prefixes spread. It keeps no state and predicts no hit rate (``prefix_hit_rate`` 0.0).
- ``round-robin``, ``random``.
- ``package.module:Class``: your own policy, any class with
  ``choose(token_ids, instance_ids) -> (worker_id, prefix_hit_rate)``, constructed with
  the Router's configuration (a dict).

This is the seam where the KV-aware router (overlap scores from the workers' KV events
and load) plugs in as another policy; the Processor's side does not change.

    python -m components.router -f configs/agg_router.yaml   # alone (from examples/llm)
"""

from __future__ import annotations

import hashlib
import importlib
import itertools
import random
import struct
from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol

from dynamo.sdk import async_on_start, depends, endpoint, run_component, service
from dynamo.sdk.lib.config import ServiceConfig, ServiceConfigError

from components.worker import Worker

DEFAULT_BLOCK_SIZE = 16


class RoutingPolicy(Protocol):
    def choose(self, token_ids: Sequence[int], instance_ids: Sequence[int]) -> tuple[int, float]:
        """The instance (one of ``instance_ids``, never empty) and the predicted prefix hit rate."""
        ...


class PrefixHashPolicy:
    """Rendezvous hashing of the first KV block (see the module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.block_size = int(config.get("kv-cache-block-size", DEFAULT_BLOCK_SIZE))
        if self.block_size < 1:
            raise ServiceConfigError(f"Router.kv-cache-block-size must be at least 1, got {self.block_size}")

    def choose(self, token_ids: Sequence[int], instance_ids: Sequence[int]) -> tuple[int, float]:
        block = struct.pack(f"<{min(len(token_ids), self.block_size)}I", *token_ids[: self.block_size])

        def weight(instance: int) -> bytes:
            return hashlib.blake2b(block + struct.pack("<Q", instance), digest_size=8).digest()

        return max(instance_ids, key=weight), 0.0


class RoundRobinPolicy:
    def __init__(self, config: dict[str, Any]) -> None:
        self._counter = itertools.count(random.randrange(1 << 16))

    def choose(self, token_ids: Sequence[int], instance_ids: Sequence[int]) -> tuple[int, float]:
        return instance_ids[next(self._counter) % len(instance_ids)], 0.0


class RandomPolicy:
    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def choose(self, token_ids: Sequence[int], instance_ids: Sequence[int]) -> tuple[int, float]:
        return random.choice(list(instance_ids)), 0.0


POLICIES: dict[str, type] = {
    "prefix-hash": PrefixHashPolicy,
    "round-robin": RoundRobinPolicy,
    "random": RandomPolicy,
}


def load_policy(name: str, config: dict[str, Any]) -> RoutingPolicy:
    """The policy named ``name`` (a built-in name or ``package.module:Class``)."""
    if name in POLICIES:
        return POLICIES[name](config)  # type: ignore[no-any-return]
    module_name, _, attr = name.partition(":")
    if not attr:
        raise ServiceConfigError(
            f"Router.policy must be one of {sorted(POLICIES)} or 'package.module:Class', got {name!r}"
        )
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ServiceConfigError(f"Router.policy {name!r} cannot be loaded: {exc}") from exc
    return cls(config)  # type: ignore[no-any-return]


@service(dynamo={"namespace": "dynamo"})
class Router:
    worker = depends(Worker)

    def __init__(self) -> None:
        self.config = ServiceConfig.get_parsed_config("Router")
        self.policy = load_policy(str(self.config.get("policy", "prefix-hash")), self.config)

    @async_on_start
    async def connect(self) -> None:
        self.workers = await self.worker.client("generate")

    @endpoint()
    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        token_ids = request.get("token_ids") if isinstance(request, dict) else None
        if not isinstance(token_ids, list):
            raise ValueError('Router.generate expects {"token_ids": [int, ...]}')
        instances = self.workers.instance_ids()
        if not instances:
            yield {"worker_id": None, "prefix_hit_rate": 0.0}
            return
        worker_id, hit_rate = self.policy.choose(token_ids, instances)
        yield {"worker_id": worker_id, "prefix_hit_rate": hit_rate}


if __name__ == "__main__":
    run_component(Router)

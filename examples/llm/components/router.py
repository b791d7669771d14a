"""The Router: token ids in, the worker instance to send them to out.

``generate({"token_ids": [...]})`` yields one ``{"worker_id": int | None,
"prefix_hit_rate": float}``; ``worker_id`` is ``None`` when no worker is registered.
The choice is made by a routing policy (``policy`` in the Router's configuration):

- ``kv`` (default): ``dynamo.llm.KvRouter`` over the Worker's instances: it follows the
  workers' KV events and load metrics and sends a prompt where the cost of prefilling
  what is not cached, plus the worker's load, is lowest (docs/kv-routing.md).
  ``prefix_hit_rate`` is the share of the prompt's full blocks the chosen worker holds.
  Keys: ``kv-cache-block-size`` (16), ``overlap-weight`` (8.0), ``temperature`` (0.0),
  ``busy-threshold`` (none), ``use-kv-events`` (true; false: predict the caches from the
  Router's own choices).
- ``prefix-hash``: rendezvous hashing of the prompt's first KV block over the live
  Worker instances, so requests that share a first block go to the same worker while
  distinct prefixes spread. It keeps no state and predicts no hit rate (0.0).
- ``round-robin``, ``random``.
- ``package.module:Class``: your own policy, any class with
  ``choose(token_ids, instance_ids) -> (worker_id, prefix_hit_rate)`` (a plain or an
  ``async`` method), constructed with the Router's configuration (a dict). A policy that
  needs the workers' endpoint also defines ``async connect(endpoint)``, awaited once
  when the Router starts.

    python -m components.router -f configs/agg_router.yaml   # alone (from examples/llm)
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import itertools
import random
import struct
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any, Protocol

from dynamo.llm import KvRouter
from dynamo.runtime import Endpoint, NoInstancesError
from dynamo.sdk import async_on_start, depends, dynamo_context, endpoint, run_component, service
from dynamo.sdk.lib.config import ServiceConfig, ServiceConfigError

from components.worker import Worker

DEFAULT_BLOCK_SIZE = 16
DEFAULT_POLICY = "kv"


class RoutingPolicy(Protocol):
    def choose(
        self, token_ids: Sequence[int], instance_ids: Sequence[int]
    ) -> tuple[int, float] | Awaitable[tuple[int, float]]:
        """The instance (one of ``instance_ids``, never empty) and the predicted prefix hit rate."""
        ...


def config_flag(config: dict[str, Any], key: str, default: bool) -> bool:
    """A yes/no key of the Router's configuration (YAML booleans or their spelling on a command line)."""
    value = config.get(key, default)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "yes", "1"):
        return True
    if str(value).lower() in ("false", "no", "0"):
        return False
    raise ServiceConfigError(f"Router.{key} must be true or false, got {value!r}")


class KvPolicy:
    """The KV-cache-aware router (see the module docstring)."""

    def __init__(self, config: dict[str, Any]) -> None:
        busy = config.get("busy-threshold")
        try:
            self.block_size = int(config.get("kv-cache-block-size", DEFAULT_BLOCK_SIZE))
            self.overlap_weight = float(config.get("overlap-weight", 8.0))
            self.temperature = float(config.get("temperature", 0.0))
            self.busy_threshold = None if busy is None else float(busy)
        except (TypeError, ValueError) as exc:
            raise ServiceConfigError(f"Router: a kv policy setting is not a number: {exc}") from exc
        self.use_kv_events = config_flag(config, "use-kv-events", True)
        self.router: KvRouter | None = None

    async def connect(self, workers: Endpoint) -> None:
        try:
            self.router = KvRouter(
                workers, block_size=self.block_size, overlap_weight=self.overlap_weight,
                temperature=self.temperature, busy_threshold=self.busy_threshold, use_kv_events=self.use_kv_events,
            )
        except ValueError as exc:  # a setting out of range
            raise ServiceConfigError(f"Router: {exc}") from exc

    async def choose(self, token_ids: Sequence[int], instance_ids: Sequence[int]) -> tuple[int, float]:
        if self.router is None:
            raise RuntimeError("KvPolicy.choose before connect()")
        worker_id, overlap_blocks = await self.router.best_worker(list(token_ids))
        full_blocks = len(token_ids) // self.router.block_size
        return worker_id, overlap_blocks / full_blocks if full_blocks else 0.0


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
    "kv": KvPolicy,
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
        self.policy = load_policy(str(self.config.get("policy", DEFAULT_POLICY)), self.config)

    @async_on_start
    async def connect(self) -> None:
        self.workers = await self.worker.client("generate")
        connect = getattr(self.policy, "connect", None)
        if connect is not None:
            namespace, component = Worker.dynamo_address()
            await connect(dynamo_context["runtime"].namespace(namespace).component(component).endpoint("generate"))

    @endpoint()
    async def generate(self, request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        token_ids = request.get("token_ids") if isinstance(request, dict) else None
        if not isinstance(token_ids, list):
            raise ValueError('Router.generate expects {"token_ids": [int, ...]}')
        instances = self.workers.instance_ids()
        if not instances:
            yield {"worker_id": None, "prefix_hit_rate": 0.0}
            return
        choice = self.policy.choose(token_ids, instances)
        try:
            worker_id, hit_rate = await choice if inspect.isawaitable(choice) else choice
        except NoInstancesError:  # the policy's own view of the instances is empty
            yield {"worker_id": None, "prefix_hit_rate": 0.0}
            return
        yield {"worker_id": worker_id, "prefix_hit_rate": hit_rate}


if __name__ == "__main__":
    run_component(Router)

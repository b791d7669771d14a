"""Test worker: the worker base (``dynamo.engine``) with a pure-Python engine adapter,
run the way ``python -m dynamo.vllm`` runs (``dynamo.engine.main.main``): the base's
flags, registration, handler, roles, KV-event bridge and load reports are the real ones;
only the engine is a toy. Its prompt decides what it does:

- a prompt holding ``w900``: the engine rejects the request (``ValueError``);
- ``w901``: the engine dies (``ToyEngineDead``) after one token;
- ``w902``: the engine's stream ends after one token without finishing;
- ``w903``: slow, a token every 50 ms (so that a caller can stop it); an aborted
  request prints ``ABORTED <request id>``;
- every engine request prints ``ENDED <request id> <tokens generated>`` when its
  stream ends, however it ends (finished, aborted, or closed by a caller gone);
- otherwise ``max_tokens`` tokens ``w3``, ``w4`` ... and ``length``.

Every request prints ``REQUEST <request id> <json of the sampling options>``; every
prompt's full blocks of ``--kv-cache-block-size`` tokens are published as KV events;
load reports count the running requests.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from dynamo.engine import BlocksStored, EngineAdapter, Failure, KvEvent, RequestError, WorkerConfig
from dynamo.engine.main import main

FIRST_WORD_TOKEN = 3
REJECT, DIE, UNFINISHED, SLOW = 900, 901, 902, 903


class ToyEngineDead(RuntimeError):
    """The toy engine's process is gone."""


class ToyEngine:
    def __init__(self, block_size: int, context: int) -> None:
        self.block_size = block_size
        self.context = context
        self.events: asyncio.Queue[KvEvent] = asyncio.Queue()
        self.event_id = 0
        self.running: set[str] = set()
        self.aborted: set[str] = set()

    def cache(self, token_ids: list[int]) -> None:
        full = len(token_ids) // self.block_size * self.block_size
        if not full:
            return
        self.event_id += 1
        blocks = [hash(tuple(token_ids[: end])) & 0x7FFF_FFFF_FFFF_FFFF
                  for end in range(self.block_size, full + 1, self.block_size)]
        self.events.put_nowait(BlocksStored(self.event_id, token_ids[:full], [self.block_size] * len(blocks), blocks))

    async def run(self, token_ids: list[int], max_tokens: int, request_id: str) -> AsyncIterator[tuple[int, bool]]:
        if REJECT in token_ids:
            raise ValueError("the toy engine refuses prompts with w900")
        self.cache(token_ids)
        self.running.add(request_id)
        generated = 0
        try:
            for i in range(max_tokens):
                if request_id in self.aborted:
                    return
                if SLOW in token_ids:
                    await asyncio.sleep(0.05)
                yield FIRST_WORD_TOKEN + i, i == max_tokens - 1
                generated += 1
                if DIE in token_ids:
                    raise ToyEngineDead("the toy engine's process exited")
                if UNFINISHED in token_ids:
                    return
        finally:
            self.running.discard(request_id)
            print(f"ENDED {request_id} {generated}", flush=True)


class ToyAdapter(EngineAdapter):
    name = "Toy"
    package = "json"
    install_hint = "(always installed)"

    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog=prog, description=description)
        p.add_argument("--toy-context", type=int, default=4096, help="the toy engine's context length")
        return p

    def model_path(self, ns: argparse.Namespace) -> str | None:
        return ns.model_path

    def engine_args(
        self, ns: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser, config: WorkerConfig
    ) -> Any:
        return {"context": ns.context_length or ns.toy_context, "block_size": ns.kv_cache_block_size or 4}

    async def start(self, config: WorkerConfig, on_load: Any) -> Any:
        return ToyEngine(config.engine_args["block_size"], config.engine_args["context"])

    def limits(self, engine: Any) -> tuple[int, int]:
        return engine.context, engine.block_size

    def kv_events(self, config: WorkerConfig, engine: Any) -> AsyncIterator[KvEvent]:
        async def events() -> AsyncIterator[KvEvent]:
            while True:
                yield await engine.events.get()

        return events()

    async def load_reports(self, engine: Any) -> AsyncIterator[dict[str, Any]]:
        while True:
            yield {"request_active_slots": len(engine.running), "request_total_slots": 8, "kv_active_blocks": 0,
                   "kv_total_blocks": 100, "num_requests_waiting": 0, "gpu_cache_usage_perc": 0.0,
                   "gpu_prefix_cache_hit_rate": 0.0}
            await asyncio.sleep(0.2)

    async def stop(self, engine: Any) -> None:
        print("ENGINE STOPPED", flush=True)

    def prepare(self, request: Mapping[str, Any], transfer: Mapping[str, Any] | None = None) -> Any:
        token_ids = request.get("token_ids")
        if not isinstance(token_ids, list) or not token_ids:
            raise RequestError("the request has no token_ids")
        max_tokens = (request.get("stop_conditions") or {}).get("max_tokens") or 4
        return token_ids, max_tokens, dict(request.get("sampling_options") or {})

    async def generate(self, engine: Any, prepared: Any, request_id: str) -> AsyncIterator[dict[str, Any]]:
        token_ids, max_tokens, options = prepared
        print(f"REQUEST {request_id} {json.dumps(options, sort_keys=True)}", flush=True)
        async for token, last in engine.run(token_ids, max_tokens, request_id):
            yield {"token_ids": [token], **({"finish_reason": "length"} if last else {})}

    async def abort(self, engine: Any, request_id: str) -> None:
        engine.aborted.add(request_id)
        print(f"ABORTED {request_id}", flush=True)

    def failure(self, error: BaseException) -> Failure | None:
        if isinstance(error, ToyEngineDead):
            return Failure.DEAD
        if isinstance(error, ValueError):
            return Failure.REJECTED
        return None

    async def prefill(
        self, engine: Any, request: Mapping[str, Any], request_id: str, stopped: Callable[[], bool]
    ) -> dict[str, Any]:
        return {"toy_pid": os.getpid(), "prompt_tokens": len(request["token_ids"])}


if __name__ == "__main__":
    sys.exit(main(ToyAdapter(), sys.argv[1:], "toy_engine_worker.py"))

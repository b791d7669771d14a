"""The request handler of every engine worker: one engine request per call, and the
rules for how a stream ends, whatever the engine.

* The caller stops the stream (stop string, ``max_tokens`` reached at the frontend):
  the engine request is aborted and the stream ends with ``cancelled``.
* The caller goes away: the runtime cancels this task, which closes the adapter's
  generator (engines abort a request whose consumer is gone).
* A request the engine rejects (prompt too long, bad parameters) ends with an error
  finish reason naming the engine's message; the worker keeps serving.
* The engine died: the stream fails as unavailable (``WorkerUnavailableError``, as if
  the worker had died: frontends migrate it where the model allows) and the runtime is
  shut down, so the worker leaves discovery and new requests go elsewhere.
* An engine stream that ends without a finish reason is an error, never a normal end.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from dynamo.engine.adapter import EngineAdapter, Failure, RequestError
from dynamo.runtime import WorkerUnavailableError

log = logging.getLogger("dynamo.engine")


def error_item(message: str) -> dict[str, Any]:
    """An ``LLMEngineOutput`` that ends a stream with an error."""
    return {"token_ids": [], "finish_reason": {"error": message}}


class Handler:
    """``generate`` (and, on a prefill worker, ``prefill``) of an engine's endpoint."""

    def __init__(self, adapter: EngineAdapter, engine: Any, runtime: Any | None = None) -> None:
        self.adapter = adapter
        self.engine = engine
        self.runtime = runtime

    def _engine_died(self, error: BaseException) -> None:
        log.error("the %s engine died: %s; shutting the worker down", self.adapter.name, error)
        if self.runtime is not None:
            self.runtime.shutdown()

    async def generate(
        self, request: dict[str, Any], context: Any, transfer: dict[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """Stream the request's tokens; ``transfer``: a prefill worker's descriptor of
        the prompt's KV (decode role), which the engine then pulls."""
        adapter = self.adapter
        request_id = context.id()
        try:
            prepared = adapter.prepare(request, transfer)
        except (RequestError, ValueError, TypeError) as e:
            yield error_item(f"invalid request: {e}")
            return
        try:
            async for item in adapter.generate(self.engine, prepared, request_id):
                if "finish_reason" not in item and context.is_stopped():
                    await adapter.abort(self.engine, request_id)
                    item["finish_reason"] = "cancelled"
                    yield item
                    return
                yield item
                if "finish_reason" in item:
                    return
        except Exception as e:
            failure = adapter.failure(e)
            if failure is Failure.DEAD:
                # Not an answer of the engine: the stream fails as the worker's would,
                # so a frontend may continue it elsewhere (migration).
                self._engine_died(e)
                raise WorkerUnavailableError(f"the {adapter.name} engine died: {e}") from e
            if failure is Failure.REJECTED:
                yield error_item(str(e))
                return
            raise
        yield error_item(f"{adapter.name} ended the stream without finishing the request")

    async def prefill(self, request: dict[str, Any], context: Any) -> dict[str, Any]:
        """A prefill job (prefill role): the engine computes the prompt for a remote
        decode and returns its transfer parameters. Raising fails the job (the decode
        worker then prefills locally); a dead engine also shuts the worker down."""
        try:
            return await self.adapter.prefill(self.engine, request, context.id(), context.is_stopped)
        except Exception as e:
            if self.adapter.failure(e) is Failure.DEAD:
                self._engine_died(e)
            raise

"""The one interface an engine fills in to be served by the worker base: what differs
between vLLM, SGLang and TensorRT-LLM, and nothing else. The base (``handler.py``,
``serve.py``, ``config.py``, ``main.py``) owns the rest.

An adapter speaks our formats at its edges: a ``PreprocessedRequest`` dict in (token
ids, ``sampling_options``, ``stop_conditions``, ``output_options``, ``eos_token_ids``),
``LLMEngineOutput`` dicts out (``token_ids``, optionally ``log_probs``,
``top_log_probs``, ``cum_log_probs``, ``cached_tokens``, and ``finish_reason`` on the last: ``eos``,
``stop``, ``length``, ``cancelled`` or ``{"error": message}``).
"""

from __future__ import annotations

import argparse
import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from dynamo.engine.config import WorkerConfig
    from dynamo.engine.kv_events import KvEventSource

#: Hands a load report (``WorkerMetricsPublisher.publish``'s keyword arguments) on.
LoadCallback = Callable[[dict[str, Any]], None]


class RequestError(ValueError):
    """The engine cannot run this request (the message says why); answered as an error
    item, and the worker keeps serving."""


class Failure(enum.Enum):
    """What an exception raised by the engine means for the worker."""

    #: The request was refused (a prompt over the context, bad parameters): an error
    #: item for this stream, the worker keeps serving.
    REJECTED = "rejected"
    #: The engine is gone: the stream fails as unavailable (``WorkerUnavailableError``:
    #: frontends migrate it where allowed), then the worker shuts down so that it
    #: leaves discovery and frontends send new requests elsewhere.
    DEAD = "dead"


class EngineAdapter(ABC):
    """What one engine provides. Methods that take ``engine`` get what :meth:`start`
    returned; the others are pure mappings, unit-tested against the engine's own
    classes."""

    #: The engine's name in messages ("vLLM").
    name: ClassVar[str]
    #: The import name whose absence makes ``python -m`` exit 2 with :attr:`install_hint`.
    package: ClassVar[str]
    #: How to install the engine, for that message.
    install_hint: ClassVar[str]
    #: Dynamo flags the engine's own parser already defines with the same meaning
    #: (e.g. SGLang's ``--model-path``, ``--context-length``): the base leaves them out.
    own_flags: ClassVar[frozenset[str]] = frozenset()

    # --- command line ----------------------------------------------------------------

    @abstractmethod
    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        """The engine's own argument parser with its engine flags (the base adds Dynamo's
        groups to it)."""

    @abstractmethod
    def engine_args(
        self, ns: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser, config: WorkerConfig
    ) -> Any:
        """The engine's arguments from the parsed flags, Dynamo's aliases applied
        (``--kv-cache-block-size``, ``--context-length``, ``--model-name``). Usage errors
        go through ``parser.error``. May adjust ``config`` (e.g. turn KV events off)."""

    @abstractmethod
    def model_path(self, ns: argparse.Namespace) -> str | None:
        """What the engine loads (a folder or a hub id), from the parsed flags."""

    def served_model_name(self, ns: argparse.Namespace) -> str | None:
        """The public name the engine's own flags give, if any."""
        return None

    def configure(self, config: WorkerConfig, free_port: Callable[[], int]) -> None:  # noqa: B027
        """Last changes to ``config.engine_args`` before the engine starts: where to
        publish KV events, the disaggregation transport (``free_port`` gives a free TCP
        port). Runs outside the event loop."""

    # --- the engine ------------------------------------------------------------------

    @abstractmethod
    async def start(self, config: WorkerConfig, on_load: LoadCallback | None) -> Any:
        """Build and start the engine. ``on_load``: where an engine that reports its load
        by callback sends it (engines that are polled use :meth:`load_reports`)."""

    @abstractmethod
    def limits(self, engine: Any) -> tuple[int, int]:
        """The engine's context length and KV block size (tokens), for the model card."""

    def kv_events(self, config: WorkerConfig, engine: Any) -> KvEventSource | None:
        """Where the engine's KV cache events come from: a ZMQ publisher
        (:class:`~dynamo.engine.kv_events.ZmqKvEvents`), an async iterator of
        :data:`~dynamo.engine.kv_events.KvEvent`, or ``None`` (none published)."""
        return None

    def load_reports(self, engine: Any) -> AsyncIterator[dict[str, Any]] | None:
        """Load reports of an engine that is polled for them (each a dict of
        ``WorkerMetricsPublisher.publish``'s arguments), until the engine stops;
        ``None`` when :meth:`start`'s callback does it."""
        return None

    @abstractmethod
    async def stop(self, engine: Any) -> None:
        """Shut the engine down (after the endpoint has drained)."""

    # --- requests --------------------------------------------------------------------

    @abstractmethod
    def prepare(self, request: Mapping[str, Any], transfer: Mapping[str, Any] | None = None) -> Any:
        """The engine's prompt and parameters for a ``PreprocessedRequest``. ``transfer``:
        on a decode worker, the prefill worker's descriptor (its ``engine_params`` are
        what :meth:`prefill` returned there); ``None`` to prefill here. Raises
        :class:`RequestError` (or ``ValueError`` / ``TypeError``) for a request the
        engine cannot run."""

    @abstractmethod
    def generate(self, engine: Any, prepared: Any, request_id: str) -> AsyncIterator[dict[str, Any]]:
        """Run a prepared request; yield ``LLMEngineOutput`` dicts, the last with a
        ``finish_reason``."""

    @abstractmethod
    async def abort(self, engine: Any, request_id: str) -> None:
        """Stop a running request (its caller stopped the stream)."""

    @abstractmethod
    def failure(self, error: BaseException) -> Failure | None:
        """What an exception from the engine means, or ``None`` when it is not the
        engine's (a bug: it propagates)."""

    # --- disaggregated serving -------------------------------------------------------

    @abstractmethod
    async def prefill(
        self, engine: Any, request: Mapping[str, Any], request_id: str, stopped: Callable[[], bool]
    ) -> dict[str, Any]:
        """A prefill worker's job: compute (or start computing) the prompt's KV for a
        remote decode and return the engine's transfer parameters, which reach the
        decode worker's :meth:`prepare` as the descriptor's ``engine_params``.
        ``stopped()`` turns true when the decode side gave the job up. Raising fails the
        job (the decode worker then prefills locally, if its engine can)."""

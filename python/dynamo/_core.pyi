"""Type stubs of the compiled core, ``dynamo._core``.

Kept by hand; ``scripts/test.sh`` runs ``mypy.stubtest`` so this file and the module
cannot drift apart.
"""

import asyncio
import os
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, final

__version__: str
#: The names ``--router-mode`` takes (``round-robin``, ``random``, ``kv``), from
#: ``dynamo_llm::routing::RouterMode``: the one parser of router modes.
ROUTER_MODES: tuple[str, ...]
#: The names ``--tool-call-parser`` takes (vLLM's spelling), from
#: ``dynamo_llm::parsers::TOOL_CALL_PARSERS``.
TOOL_CALL_PARSERS: tuple[str, ...]
#: The names ``--reasoning-parser`` takes (vLLM's spelling), from
#: ``dynamo_llm::parsers::REASONING_PARSERS``.
REASONING_PARSERS: tuple[str, ...]
__all__ = [
    "REASONING_PARSERS",
    "ROUTER_MODES",
    "TOOL_CALL_PARSERS",
    "Annotated",
    "ChunkStream",
    "Client",
    "Component",
    "ConfigError",
    "DistributedRuntime",
    "DynamoError",
    "DynamoTimeoutError",
    "Endpoint",
    "HandlerError",
    "InstanceNotFoundError",
    "KeyValueStore",
    "KvEventPublisher",
    "KvIndexer",
    "KvRouter",
    "Namespace",
    "NoInstancesError",
    "OpenAIPreprocessor",
    "OverlapScores",
    "PayloadTooLargeError",
    "PlannerLab",
    "PrefillWorker",
    "PreprocessedRequest",
    "RadixTree",
    "ReasoningStream",
    "RemotePrefill",
    "RequestContext",
    "ResponseStream",
    "StreamDisconnectedError",
    "Subscription",
    "ToolCallStream",
    "WorkerMetricsPublisher",
    "__version__",
    "compute_block_hash_for_seq",
    "drain_bound_s",
    "parse_reasoning",
    "parse_tool_calls",
    "planner_lab_point",
    "register_llm",
    "run_dynamo_run",
    "run_routing_lab",
    "serve_prefill_worker",
]

class DynamoError(Exception):
    """Base class of the runtime's errors."""

class ConfigError(DynamoError):
    """A configuration value is missing or invalid (the message names it)."""

class NoInstancesError(DynamoError):
    """No instance of the endpoint is registered."""

class InstanceNotFoundError(DynamoError):
    """``direct()`` named an instance id that is not registered."""

class StreamDisconnectedError(DynamoError):
    """The worker could not be reached, or died / dropped the connection mid-stream."""

class DynamoTimeoutError(DynamoError):
    """A bounded wait ran out (``wait_for_instances(timeout=…)``, NATS acknowledgement, …)."""

class PayloadTooLargeError(DynamoError):
    """A request exceeds the size limit of the plane that would carry it."""

class HandlerError(ValueError):
    """The remote handler raised; ``str(e)`` is ``"<ExceptionType>: <message>"``."""

@final
class DistributedRuntime:
    """The process's handle on discovery and the request, response and event planes.

    Arguments:
        event_loop: the asyncio loop results are delivered on (the running loop).
        is_static: accepted for compatibility; changes nothing.
        discovery: ``"file"``, ``"etcd"`` or ``"mem"``; default ``DYN_DISCOVERY_BACKEND`` or ``file``.
        request_plane: ``"tcp"`` or ``"nats"``; default ``DYN_REQUEST_PLANE`` or ``tcp``.
        event_plane: ``"tcp"`` or ``"nats"``; default ``DYN_EVENT_PLANE`` or ``tcp``.

    Raises:
        ConfigError: a value (argument or environment variable) is invalid.
        DynamoError: a backend (etcd, NATS) cannot be reached within the connect timeout.
    """

    def __new__(
        cls,
        event_loop: asyncio.AbstractEventLoop,
        is_static: bool = False,
        *,
        discovery: str | None = None,
        request_plane: str | None = None,
        event_plane: str | None = None,
    ) -> DistributedRuntime: ...
    def namespace(self, name: str) -> Namespace:
        """A namespace handle."""
    def endpoint(self, path: str) -> Endpoint:
        """The endpoint at ``"namespace.component.endpoint"`` (``dyn://`` prefix allowed)."""
    def instance_id(self) -> int:
        """This process's instance id, the same for all its endpoints and its whole life."""
    def event_loop(self) -> asyncio.AbstractEventLoop:
        """The loop the runtime is bound to."""
    def system_address(self) -> str | None:
        """``host:port`` of the system server (``DYN_SYSTEM_ENABLED``), else ``None``."""
    def shutdown(self) -> Awaitable[None]:
        """Begin graceful shutdown now: unregister, drain in-flight streams (bounded by
        ``DYN_SHUTDOWN_TIMEOUT``), give up the lease, close connections. The returned
        awaitable completes when shutdown is done; it need not be awaited."""
    def closed(self) -> Coroutine[Any, Any, None]:
        """Completes when shutdown has finished."""
    def is_shutting_down(self) -> bool:
        """Whether shutdown has begun."""
    def set_ready(self, ready: bool) -> None:
        """Hold (``False``) or give (``True``) this process's readiness mark. While it is
        held the system server's ``/ready`` answers 503 even with endpoints registered;
        once given, 200 until the process drains. A worker with an engine to check holds
        it before it serves and gives it once its endpoints are registered and the engine
        answered a first request; a process that never touches it is ready once an
        endpoint of it is registered in discovery (and not draining)."""
    def not_ready(self) -> str | None:
        """``None`` when the process is ready (``/ready`` answers 200), else why not:
        ``"draining"``, ``"not_registered"`` or ``"engine_not_ready"``."""
    def kv_store(self) -> KeyValueStore:
        """The discovery backend's key-value store."""
    def etcd_client(self) -> KeyValueStore:
        """Same as ``kv_store()``: the reference API's name, on every backend."""

@final
class KeyValueStore:
    """Keys and values in the discovery backend (etcd, file or mem). ``lease_id``:
    ``None`` (or this process's lease) binds the key to the process — it vanishes when
    the process dies; ``0`` writes it without a lease."""

    def primary_lease_id(self) -> int:
        """This process's lease id."""
    def kv_create(self, key: str, value: bytes, lease_id: int | None = None) -> Awaitable[None]:
        """Create ``key``.

        Raises:
            DynamoError: the key exists (``already_exists``).
        """
    def kv_create_or_validate(self, key: str, value: bytes, lease_id: int | None = None) -> Awaitable[None]:
        """Create ``key``, or succeed if it already holds exactly ``value``."""
    def kv_put(self, key: str, value: bytes, lease_id: int | None = None) -> Awaitable[None]:
        """Write ``key``."""
    def kv_get(self, key: str) -> Awaitable[bytes | None]:
        """The value of ``key``, or ``None``."""
    def kv_get_prefix(self, prefix: str) -> Awaitable[list[dict[str, Any]]]:
        """Every key under ``prefix`` as ``{"key": str, "value": bytes}``, in key order."""
    def kv_delete(self, key: str) -> Awaitable[None]:
        """Delete ``key``."""

@final
class Namespace:
    """A group of components and an event scope."""

    def component(self, name: str) -> Component:
        """A component of this namespace."""
    def name(self) -> str:
        """The namespace's name."""
    def publish(self, name: str, obj: Any) -> Awaitable[None]:
        """Publish ``obj`` (JSON-able) as event ``name`` of this namespace."""
    def subscribe(self, name: str) -> Awaitable[Subscription]:
        """Subscribe to event ``name`` of this namespace."""

@final
class Component:
    """A kind of worker, with endpoints."""

    def endpoint(self, name: str) -> Endpoint:
        """An endpoint of this component."""
    def name(self) -> str:
        """The component's name."""
    def create_service(self) -> Awaitable[None]:
        """Kept for compatibility: endpoints register themselves when served."""
    def publish(self, name: str, obj: Any) -> Awaitable[None]:
        """Publish ``obj`` (JSON-able) as event ``name`` of this component."""
    def subscribe(self, name: str) -> Awaitable[Subscription]:
        """Subscribe to event ``name`` of this component."""

@final
class Endpoint:
    """A named streaming request handler of a component."""

    def serve_endpoint(self, handler: Any) -> Coroutine[Any, Any, None]:
        """Serve ``handler(request)`` or ``handler(request, context)`` (an async generator
        function, or a coroutine function returning one item) until the runtime shuts
        down and in-flight streams have drained.

        Raises:
            DynamoError: the endpoint is already served by this process, or the runtime
                is shutting down.
        """
    def client(self) -> Coroutine[Any, Any, Client]:
        """A client of this endpoint."""
    def lease_id(self) -> int:
        """The instance id this endpoint registers with."""
    def name(self) -> str:
        """The endpoint's name."""
    def path(self) -> str:
        """``namespace.component.endpoint``."""

@final
class Client:
    """Calls one endpoint, routing among its instances."""

    def instance_ids(self) -> list[int]:
        """Ids of the registered instances, ascending."""
    def instances(self) -> list[dict[str, Any]]:
        """The registered instances (``instance_id``, ``namespace``, ``component``,
        ``endpoint``, ``transport``), ordered by id."""
    def endpoint_ids(self) -> list[int]:
        """Same as ``instance_ids()``."""
    def wait_for_instances(self, timeout: float | None = None) -> Coroutine[Any, Any, list[int]]:
        """Wait until an instance is registered and return the ids.

        Raises:
            DynamoTimeoutError: ``timeout`` seconds passed with no instance.
        """
    def generate(self, request: Any, annotated: bool = True) -> Awaitable[ResponseStream]:
        """Send to the next instance in turn (the default routing)."""
    def round_robin(self, request: Any, annotated: bool = True) -> Awaitable[ResponseStream]:
        """Send to the next instance in turn."""
    def random(self, request: Any, annotated: bool = True) -> Awaitable[ResponseStream]:
        """Send to a random instance."""
    def direct(self, request: Any, instance_id: int, annotated: bool = True) -> Awaitable[ResponseStream]:
        """Send to ``instance_id``.

        Raises:
            InstanceNotFoundError: the id is not registered.
        """

@final
class ResponseStream:
    """Response items of one request. Items are :class:`Annotated` (or the raw data with
    ``annotated=False``). Iteration raises :class:`HandlerError` if the handler failed and
    :class:`StreamDisconnectedError` if the worker died. Dropping the stream before its
    end kills it on the worker."""

    def __aiter__(self) -> ResponseStream: ...
    def __anext__(self) -> Awaitable[Any]: ...
    def stop_generating(self) -> None:
        """Ask the worker to stop; items already sent and the end still arrive."""
    def kill(self) -> None:
        """Abandon the stream now."""
    def is_done(self) -> bool:
        """Whether the stream has ended."""

@final
class Annotated:
    """A response item and its annotations."""

    def data(self) -> Any:
        """The item's data."""
    def id(self) -> str | None:
        """The item's id, if any."""
    def event(self) -> str | None:
        """The annotation's event name, if any."""
    def comments(self) -> list[str] | None:
        """The annotation's comments, if any."""
    def is_error(self) -> bool:
        """Whether this is an error annotation."""

@final
class RequestContext:
    """What a handler knows about its request: the id and whether the caller stopped it."""

    def id(self) -> str:
        """The request id (the caller's, propagated)."""
    def is_stopped(self) -> bool:
        """True once the caller asked to stop (or killed the stream)."""
    def is_killed(self) -> bool:
        """True once the caller is gone; the handler's task is being cancelled."""
    def stop_generating(self) -> None:
        """Mark the stream stopped from the handler side."""
    def stopped(self) -> Awaitable[None]:
        """Completes when the stream is stopped or killed."""
    def async_killed_or_stopped(self) -> Awaitable[None]:
        """Same as ``stopped()``."""
    def killed(self) -> Awaitable[None]:
        """Completes when the stream is killed."""
    def _attach_task(self, task: asyncio.Task[Any]) -> None: ...

@final
class Subscription:
    """Events of one subject, decoded from JSON."""

    def __aiter__(self) -> Subscription: ...
    def __anext__(self) -> Awaitable[Any]: ...

def register_llm(
    endpoint: Endpoint,
    model_path: str | os.PathLike[str] | None = None,
    model_name: str | None = None,
    kind: str = "backend",
    context_length: int | None = None,
    kv_cache_block_size: int | None = None,
    migration_limit: int | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    chat_template: str | os.PathLike[str] | None = None,
) -> Coroutine[Any, Any, None]:
    """Register the model served on ``endpoint`` so that frontends discover it: build its
    card, serve the card on ``{endpoint}_card`` of the same component, and write the
    model entry under ``v1/models/{ns}/{component}/{endpoint}/{instance}``, bound to this
    process's lease (it disappears when the process dies or shuts down).

    Registering before or after the endpoint starts serving both work: frontends list
    (and route to) the model only once an instance of the endpoint is discoverable.

    Arguments:
        endpoint: the endpoint whose handler serves the model.
        model_path: a HuggingFace model folder (``tokenizer.json``, ``tokenizer_config.json``,
            ``config.json``; weights are not read). ``None``: the built-in card (a
            byte-level tokenizer, every byte one token, and a plain chat template).
        model_name: the public name (``model`` in requests); default the folder's name,
            or ``"dynamo"`` for the built-in card.
        kind: ``"backend"`` (token ids in and out; the frontend tokenizes with the card),
            ``"chat"`` (OpenAI chat requests in, chunks out; also sent completions) or
            ``"completions"``.
        context_length: overrides the card's context length (tokens, at least 1).
        kv_cache_block_size: overrides the card's KV block size (tokens, at least 1).
        migration_limit: how many times a frontend may continue a stream of this model
            on another worker when its worker dies or stalls mid-stream (prompt plus the
            tokens generated so far are re-sent). ``None``: the frontend's
            ``--migration-limit`` (default 0).
        tool_call_parser: the parser (a name of ``TOOL_CALL_PARSERS``, vLLM's names)
            frontends run on this model's chat output to split out ``tool_calls``;
            needed to serve ``tool_choice: auto``.
        reasoning_parser: the parser (a name of ``REASONING_PARSERS``) that splits the
            model's thinking into ``reasoning_content``.
        chat_template: a Jinja chat template file replacing the model's own.

    Returns:
        A coroutine that completes once the model is registered.

    Raises:
        ValueError: ``kind`` is not one of the three (raised at the call).
        ConfigError: a parser name is not registered (raised at the call; the message
            lists the known names).
        ConfigError: the model folder is missing or unreadable, its tokenizer does not
            load (``backend``), an override is 0, or the card is larger than the request
            plane carries.
        DynamoError: discovery failed (e.g. the runtime is shutting down).
    """

@final
class OpenAIPreprocessor:
    """Tokenizes OpenAI requests with one model card and turns a worker's token stream
    back into OpenAI chunks (the Rust preprocessor, detokenizer and chunk builder), for a
    processor that picks the worker itself between the two steps."""

    def __new__(
        cls,
        model_path: str | os.PathLike[str] | None = None,
        model_name: str | None = None,
        context_length: int | None = None,
        kv_cache_block_size: int | None = None,
        tool_call_parser: str | None = None,
        reasoning_parser: str | None = None,
        chat_template: str | os.PathLike[str] | None = None,
    ) -> OpenAIPreprocessor:
        """Load the card of ``model_path`` (a HuggingFace folder), or the built-in card
        (byte-level tokenizer) named ``model_name`` when no path is given.
        ``tool_call_parser``, ``reasoning_parser`` and ``chat_template`` as for
        ``register_llm``: the chunks ``generate`` yields then carry ``tool_calls`` and
        ``reasoning_content`` (docs/tools.md).

        Raises:
            ConfigError: the folder is missing, its tokenizer does not load, a parser
                name is unknown (the message lists the known ones) or the template file
                cannot be read.
        """
    @property
    def model_name(self) -> str:
        """The model's public name."""
    @property
    def kv_cache_block_size(self) -> int:
        """Tokens per KV block of the card."""
    def preprocess(self, request: Any) -> PreprocessedRequest:
        """Template and tokenize an OpenAI request: a chat request (it has ``messages``)
        or a completions request (a dict, or a JSON string).

        Raises:
            ValueError: the request is invalid or longer than the context.
        """
    def generate(
        self,
        request: PreprocessedRequest,
        client: Client,
        instance_id: int | None = None,
        context: RequestContext | None = None,
    ) -> Coroutine[Any, Any, ChunkStream]:
        """Send ``request`` to a worker of ``client``'s endpoint (``instance_id`` when given,
        else round-robin) and stream the OpenAI items a chat model's worker yields to a
        frontend: ``{"data": chunk, ...}``. ``context`` (the handler's) carries cancellation.

        Raises:
            NoInstancesError: the endpoint has no instance.
            ValueError: the worker rejected the request.
        """

@final
class PreprocessedRequest:
    """A tokenized OpenAI request (from :meth:`OpenAIPreprocessor.preprocess`)."""

    @property
    def token_ids(self) -> list[int]:
        """The prompt's token ids."""
    @property
    def request(self) -> dict[str, Any]:
        """The token-level request a worker receives."""
    @property
    def prompt(self) -> str:
        """The rendered prompt (empty for a token-id prompt)."""
    @property
    def kind(self) -> str:
        """``"chat"`` or ``"completion"``."""

@final
class ChunkStream:
    """The OpenAI items of one generated request."""

    def __aiter__(self) -> ChunkStream: ...
    def __anext__(self) -> Awaitable[Any]: ...

def drain_bound_s(env: dict[str, str]) -> float:
    """The drain bound, in seconds, of a process whose environment is ``env``
    (``DYN_SHUTDOWN_TIMEOUT``, 30 when unset), read as its runtime reads it.

    Raises:
        ConfigError: the runtime would refuse ``env`` (any of its variables) at its start.
    """

def run_dynamo_run(argv: list[str]) -> int:
    """Run the ``dynamo-run`` command line in this process until it ends (an HTTP or
    ``dyn://`` input runs until SIGINT/SIGTERM), blocking the calling thread without
    holding the GIL. dynamo-run installs its own SIGINT/SIGTERM handling; Python's SIGINT
    handler still sees the signal (set it to ``signal.SIG_DFL`` first, as the
    ``dynamo-run`` console script does, to avoid a ``KeyboardInterrupt`` afterwards).

    Arguments:
        argv: the arguments without the program name, e.g.
            ``["in=http", "out=echo_full", "--http-port", "8080"]``.

    Returns:
        The exit status: 0 on success, 2 for a bad command line, 1 for other errors
        (printed to stderr as ``dynamo-run: error: ...``).
    """

# Disaggregated serving for Python engines (docs/disagg.md): the core's decision rule,
# prefill queue, bound and counters, driven from a Python token-level worker.

@final
class RemotePrefill:
    """A decode worker's side of disaggregated serving. Per request, ``prefill``
    decides (by the core's rule) whether the prompt is prefilled by a prefill worker,
    and if so queues the job and waits, bounded, for the prefill worker's transfer
    descriptor; the handler then generates with the descriptor's ``engine_params``.
    Counts every prefill in ``dynamo_disagg_prefills_total{source}`` on the system
    server's ``/metrics``."""

    @staticmethod
    def connect(
        endpoint: Endpoint,
        prefill_endpoint: str | None = None,
        max_local_prefill_length: int = 1000,
        max_prefill_queue_size: int = 2,
        remote_prefill_timeout: float = 30.0,
    ) -> Coroutine[Any, Any, RemotePrefill]:
        """Connect the decode worker serving ``endpoint`` to the prefill queue: the
        request plane, or the JetStream stream ``{namespace}_prefill_queue`` when the
        event plane is NATS (the server must run with JetStream).

        Arguments:
            endpoint: the decode worker's endpoint (its runtime registers the counters;
                once per process).
            prefill_endpoint: the prefill workers' ``namespace.component.endpoint``
                (default ``{namespace}.prefill.generate``).
            max_local_prefill_length: a prompt goes remote only if its uncached part is
                longer than this (tokens)...
            max_prefill_queue_size: ...and fewer than this many jobs wait (0: never).
            remote_prefill_timeout: seconds from queueing to the descriptor, after which
                the worker prefills locally.

        Raises:
            ValueError: a timeout that is not a positive number.
            ConfigError: a malformed ``prefill_endpoint``.
            DynamoError: the queue cannot be opened (e.g. NATS without JetStream).
        """
    @property
    def transport(self) -> str:
        """Where prefill jobs go: ``"request_plane"`` or ``"jetstream"``."""
    def prefill(
        self, token_ids: list[int], context: RequestContext, cached_tokens: int = 0
    ) -> Coroutine[Any, Any, dict[str, Any] | None]:
        """Have the prompt prefilled remotely if the rule says so.

        Arguments:
            token_ids: the prompt.
            context: the handler's request context (its id names the job; a stopped
                request stops waiting).
            cached_tokens: how much of the prompt the engine has in its prefix cache
                (the rule counts only the rest).

        Returns:
            The transfer descriptor (``request_id``, ``source_worker``, ``block_size``,
            ``block_hashes``, ``prompt_tokens`` and, when the prefill engine gave them,
            ``engine_params``) once a prefill worker computed the prompt; ``None`` when
            the engine must prefill locally: by the rule, with no prefill worker up, or
            after the remote prefill failed or ran out of time (never an exception).
        """

@final
class PrefillWorker:
    """A prefill worker started by :func:`serve_prefill_worker`."""

    def shutdown(self) -> Coroutine[Any, Any, None]:
        """Stop pulling jobs from the JetStream queue. The endpoint serves until the
        runtime shuts down."""

def serve_prefill_worker(
    endpoint: Endpoint,
    prefill: Callable[[dict[str, Any], RequestContext], Awaitable[dict[str, Any] | None]],
    block_size: int,
    max_concurrent_prefills: int = 2,
) -> Coroutine[Any, Any, PrefillWorker]:
    """Serve prefill jobs on ``endpoint`` (and pull them from the JetStream queue when
    the event plane is NATS), at most ``max_concurrent_prefills`` at a time; the
    endpoint registers no model. Counts jobs in
    ``dynamo_disagg_prefill_jobs_total{outcome}``.

    Arguments:
        endpoint: where decode workers send jobs (``{namespace}.prefill.generate`` by
            default on their side).
        prefill: ``async def prefill(request: dict, context: RequestContext) -> dict | None``:
            compute the prompt of ``request`` (a ``PreprocessedRequest`` dict:
            ``token_ids``, ``stop_conditions.max_tokens`` = 1) and return the engine's
            transfer parameters, which reach the decode side as the descriptor's
            ``engine_params`` unchanged (``None``: none). An exception fails the job
            (the decode worker prefills locally). Cancelled when the job is given up.
        block_size: the engine's KV block size (tokens), for the descriptor's block hashes.
        max_concurrent_prefills: jobs computed at once; the rest wait in the queue.

    Raises:
        TypeError: ``prefill`` is not callable.
        ValueError: ``block_size`` or ``max_concurrent_prefills`` below 1.
    """

# KV-aware routing: the index of the fleet's caches and what engines publish to it.
# Formats: docs/kv-routing.md.

def compute_block_hash_for_seq(tokens: list[int], block_size: int, lora_name: str | None = None) -> list[int]:
    """The tokens hash of every full block of ``tokens``: xxh3-64 (seed 1337) over the
    block's token ids as little-endian u32. A partial last block gets none.

    Arguments:
        tokens: token ids (each 0 to 2**32-1).
        block_size: tokens per block, at least 1.
        lora_name: the LoRA adapter the blocks belong to; its name salts the hashes so
            that blocks of different adapters never match.

    Returns:
        One hash per full block: what ``RadixTree.find_matches`` takes.

    Raises:
        ValueError: ``block_size`` is 0.
        OverflowError: a token id is negative or does not fit 32 bits.
    """

@final
class OverlapScores:
    """How many leading blocks of a request each worker holds."""

    @property
    def scores(self) -> dict[int, int]:
        """Worker id → matched leading blocks; workers matching none are absent."""

@final
class RadixTree:
    """The fleet's KV cache index: a radix tree of block hashes whose nodes list the
    workers holding them, fed by hand with KV events."""

    def __new__(cls) -> RadixTree: ...
    def apply_event(self, worker_id: int, event: bytes | str) -> None:
        """Apply one KV event of ``worker_id``. Events that cannot apply exactly (an
        unknown ``parent_hash``, a removal of a block the worker does not hold) are
        counted in ``stats()`` and otherwise ignored.

        Arguments:
            worker_id: the worker's instance id.
            event: JSON: ``{"event_id": 7, "data": {"stored": {"parent_hash": null,
                "blocks": [{"block_hash": 111, "tokens_hash": 57569...}]}}}``,
                ``{"event_id": 8, "data": {"removed": {"block_hashes": [111]}}}`` or
                ``{"event_id": 9, "data": "cleared"}``.

        Raises:
            ValueError: ``event`` is not such JSON.
        """
    def find_matches(self, hashes: list[int]) -> OverlapScores:
        """How many leading blocks of ``hashes`` (tokens hashes, as
        ``compute_block_hash_for_seq`` gives) each worker holds."""
    def remove_worker(self, worker_id: int) -> None:
        """Forget everything ``worker_id`` holds."""
    def dump_tree_as_events(self) -> list[str]:
        """The index as ``stored`` events, JSON strings ``{"worker_id": 1, "event":
        {...}}``, parents first: applying each ``event`` for its ``worker_id`` to an
        empty tree rebuilds this one."""
    def stats(self) -> dict[str, int]:
        """Counters: ``events``, ``unknown_parents``, ``unknown_removals``,
        ``event_id_gaps``, ``expired``."""

@final
class KvIndexer:
    """A ``RadixTree`` that follows the KV events of a component's workers (its
    ``kv_events`` subject) and forgets a worker once its instance leaves discovery."""

    def __new__(cls, component: Component, kv_block_size: int) -> KvIndexer:
        """Subscribe and start following.

        Raises:
            ValueError: ``kv_block_size`` is 0.
            DynamoError: the subscription failed.
        """
    def block_size(self) -> int:
        """Tokens per block."""
    def find_matches_for_request(self, token_ids: list[int], lora_name: str | None = None) -> Awaitable[OverlapScores]:
        """Awaitable: how many leading full blocks of ``token_ids`` each worker holds."""
    def find_matches(self, hashes: list[int]) -> OverlapScores:
        """How many leading blocks of ``hashes`` (tokens hashes) each worker holds."""
    def remove_worker(self, worker_id: int) -> None:
        """Forget a worker now."""
    def listed_workers(self) -> list[int]:
        """The workers (ascending) its last look at discovery found (it looks every
        second); it forgets a worker only once it saw it listed."""
    def dump_tree_as_events(self) -> list[str]:
        """The index as ``stored`` events (see ``RadixTree.dump_tree_as_events``)."""
    def stats(self) -> dict[str, int]:
        """Counters (see ``RadixTree.stats``)."""

@final
class KvEventPublisher:
    """An engine's KV events, published on its component's ``kv_events`` subject for
    routers and ``KvIndexer``s. The ``publish_*`` calls never block: events are queued
    (4096 at most) for a background task; each returns False when the queue was full and
    the event was dropped."""

    def __new__(cls, component: Component, worker_id: int | None = None, kv_block_size: int = 16) -> KvEventPublisher:
        """Arguments:
            component: the engine's component.
            worker_id: the id routers know the engine by; default this process's
                instance id (that of the endpoints it serves).
            kv_block_size: tokens per block, at least 1.
        """
    @property
    def worker_id(self) -> int:
        """The worker id the events carry."""
    def publish_stored(
        self,
        event_id: int,
        token_ids: list[int],
        num_block_tokens: list[int],
        block_hashes: list[int],
        lora_name: str | None = None,
        parent_hash: int | None = None,
    ) -> bool:
        """Blocks entered the cache: ``token_ids`` split into blocks of
        ``num_block_tokens[i]`` tokens named ``block_hashes[i]`` by the engine, the first
        following the engine's block ``parent_hash`` (``None`` at a sequence's start).
        The first block that is not full ends the event. Block ids may be signed or
        unsigned 64-bit integers.

        Raises:
            ValueError: the lists disagree in length, or ask for more tokens than given.
        """
    def publish_removed(self, event_id: int, block_hashes: list[int]) -> bool:
        """Blocks (the engine's ids) left the cache."""
    def publish_cleared(self, event_id: int) -> bool:
        """The whole cache was dropped."""

@final
class WorkerMetricsPublisher:
    """An engine's load, published on its component's ``load_metrics`` subject when it
    changes (at most every 100 ms) and at least every second, until dropped."""

    def __new__(cls, component: Component, worker_id: int | None = None) -> WorkerMetricsPublisher:
        """``worker_id`` defaults to this process's instance id."""
    @property
    def worker_id(self) -> int:
        """The worker id the metrics carry."""
    def publish(
        self,
        request_active_slots: int,
        request_total_slots: int,
        kv_active_blocks: int,
        kv_total_blocks: int,
        num_requests_waiting: int,
        gpu_cache_usage_perc: float,
        gpu_prefix_cache_hit_rate: float,
        data_parallel_rank: int | None = None,
    ) -> None:
        """Replace the published load (the percentages are fractions, 0 to 1)."""

@final
class KvRouter:
    """Chooses, for a prompt's token ids, the instance of an endpoint to send it to, as
    ``dynamo-run --router-mode kv`` does: the cached prefix each worker holds (from the
    component's ``kv_events``, or predicted from earlier choices), its load (its
    ``load_metrics`` plus what was chosen since), the temperature and the busy threshold.
    See docs/kv-routing.md.

    Arguments:
        endpoint: the workers' endpoint; its live instances are the candidates.
        block_size: tokens per KV block, as the workers hash them (at least 1).
        overlap_weight: weight of a block to prefill against a block in use (>= 0).
        temperature: softmax temperature over the normalised cost (0: cheapest wins).
        busy_threshold: fraction (0, 1] of a worker's KV blocks in use from which it is
            busy; ``None``: never.
        use_kv_events: follow the workers' KV events (``False``: predictions only).
        replica_sync: share choices with the other routers of the same workers (frontends,
            other ``KvRouter``s) on the event plane, and start from a peer's snapshot.

    Raises:
        ValueError: a setting is out of range.
        DynamoError: subscribing or discovery failed.
    """

    def __new__(
        cls,
        endpoint: Endpoint,
        block_size: int = 16,
        overlap_weight: float = 8.0,
        temperature: float = 0.0,
        busy_threshold: float | None = None,
        use_kv_events: bool = True,
        replica_sync: bool = True,
    ) -> KvRouter: ...
    @property
    def block_size(self) -> int:
        """Tokens per block."""
    def schedule(self, token_ids: list[int]) -> Awaitable[int]:
        """The instance id to send a prompt of ``token_ids`` to (counted as sent there).

        Raises:
            NoInstancesError: the endpoint has no instance.
            DynamoError: every instance is over the busy threshold.
        """
    def best_worker(self, token_ids: list[int]) -> Awaitable[tuple[int, int]]:
        """``(instance id, leading blocks of the prompt it holds)``; as :meth:`schedule`."""

def run_routing_lab(
    trace_path: str | os.PathLike[str],
    policy: str,
    workers: int = 4,
    trace_block_size: int = 512,
    seed: int = 0,
    slow_worker_factor: float = 1.0,
    time_scale: float = 1.0,
    overlap_weight: float = 8.0,
    temperature: float = 0.0,
    busy_threshold: float | None = None,
    engine_args: str | None = None,
    max_inflight_requests: int | None = None,
    max_queued_tokens: int | None = None,
    admission_ttft_ms: float | None = None,
) -> dict[str, Any]:
    """Replay a Mooncake-format trace (JSON lines: ``timestamp`` ms, ``input_length``,
    ``output_length``, ``hash_ids``) through ``workers`` simulated mocker engines on a
    virtual clock, routing with ``policy`` (``kv``, ``approx``, ``round-robin``,
    ``random``), without the GIL. ``python -m dynamo.router.lab`` is its command line.
    ``engine_args`` is a JSON object of mocker settings (docs/mocker.md); the lab's
    workers have 26,624 KV blocks (an 80 GB GPU serving an 8B model) unless it sets
    ``num_gpu_blocks``. ``max_inflight_requests``, ``max_queued_tokens`` and
    ``admission_ttft_ms`` are the frontend's admission limits (docs/reliability.md),
    applied to each arrival on the virtual clock.

    Returns:
        ``policy``, ``requests``, ``completed``, ``admitted``, ``refused`` (by
        admission), ``rejected``, ``hit_rate``, ``ttft_p50_ms``, ``ttft_p99_ms`` (of
        the admitted requests), ``itl_p50_ms``, ``throughput_tok_s``,
        ``load_imbalance``, ``per_worker`` (requests each), ``simulated_s`` and
        ``ttft_ms`` (every request's TTFT).

    Raises:
        OSError: the trace cannot be read.
        ValueError: a line is not a request, or a setting is out of range.
    """

@final
class PlannerLab:
    """A simulated mocker fleet replaying a trace on a virtual clock that the caller steps
    (the planner lab, ``python -m dynamo.planner.lab``). Requests go to the ready replicas
    through the frontend's KV selector (without KV events); arrivals with none ready wait
    at the frontend. ``set_replicas`` resizes it
    as a connector would: a new replica costs from then on, is ready ``startup_s`` later
    and runs its first ``warmup_s`` of steps ``warmup_factor`` times slower; a removed
    replica still starting goes at once, a ready one drains (no new requests, finishes its
    own) and then goes. The work runs without the GIL.

    Give either ``trace_path`` (a Mooncake-format trace) or ``requests``
    (``(timestamp ms, input tokens, output tokens)`` each, unique prompts). Timestamps
    are divided by ``time_scale``; ``seed`` seeds the engines; ``engine_args`` is a JSON
    object of mocker settings (docs/mocker.md), with 26,624 KV blocks unless it sets
    ``num_gpu_blocks``. ``busy_threshold`` is the router's (a fraction of a replica's KV
    blocks): while every ready replica is at or over it, arrivals wait at the frontend
    for the first that is not; ``None``: each arrival goes to a replica at once.
    ``busy_wait_s`` bounds that wait as the frontend's ``--busy-wait-s`` does: an arrival
    still held that many seconds after it arrived, while a replica is ready, is refused
    (counted in the window's ``rejected``); ``None``: no bound. It needs
    ``busy_threshold``.

    With ``prefill_replicas`` and ``decode_replicas`` (both, and ``replicas`` is then not
    used) the fleet is disaggregated, as the serving path runs: a request goes to a ready
    decode replica (the decode pool's selector; arrivals wait at the frontend while none
    is ready), which prefills it itself unless a prefill replica is ready, the prompt's
    part not in its cache is longer than ``max_local_prefill_length`` and the shared
    prefill queue holds fewer than ``max_prefill_queue_size`` jobs (the decode worker's
    rule and defaults). A remote prefill joins that one FIFO queue; a ready prefill
    replica pulls the oldest job while it holds fewer than 2 (the prefill worker's
    ``max_concurrent_prefills``), computes it (a one-token generation whose token is not
    sent), and its full KV blocks (``blocks · block_size · kv_bytes_per_token`` bytes)
    go to the decode replica that queued it, each replica's send and receive links of
    ``kv_transfer_gbps`` (from ``engine_args``) shared fairly by the transfers under way
    (a lone one takes the mocker's transfer time), are cached there, and the decode replica
    emits the first token and the rest. A job still queued after 30 s (the remote prefill
    timeout) is prefilled by its decode replica. Each pool is resized with
    ``set_replicas(n, role=...)``, starts, warms up and drains as above (a draining
    prefill replica pulls no more jobs).

    Raises:
        OSError: the trace cannot be read.
        ValueError: a line is not a request, both or neither source given, or a setting
            is out of range.
    """

    def __new__(
        cls,
        trace_path: str | os.PathLike[str] | None = None,
        requests: list[tuple[float, int, int]] | None = None,
        *,
        replicas: int = 1,
        trace_block_size: int = 512,
        time_scale: float = 1.0,
        startup_s: float = 30.0,
        warmup_s: float = 10.0,
        warmup_factor: float = 2.0,
        seed: int = 0,
        engine_args: str | None = None,
        busy_threshold: float | None = None,
        busy_wait_s: float | None = None,
        prefill_replicas: int | None = None,
        decode_replicas: int | None = None,
        max_local_prefill_length: int = 1000,
        max_prefill_queue_size: int = 2,
    ) -> PlannerLab: ...
    def advance(self, until_s: float) -> dict[str, Any]:
        """Run to ``until_s`` simulated seconds (a time in the past leaves the clock).

        Returns:
            The window since the last call: ``start_s``, ``end_s``, ``arrivals``,
            ``arrival_input_tokens``, ``rejected``, ``failed_at_scale_down``,
            ``frontend_queue`` (waiting for a replica; disaggregated: a decode replica),
            ``prefill_queue`` (disaggregated: jobs in the prefill queue, not yet pulled),
            ``remote_prefills`` and ``local_prefills`` (disaggregated: prefills queued, and
            prefills the decode replicas ran themselves, in the window; a remote prefill
            given up counts in both), ``fallback_prefills`` (remote prefills given up
            because their KV had not landed within the remote prefill timeout),
            ``transferring`` (KV transfers under
            way), ``inflight``, ``replica_seconds`` (since time 0),
            ``role_seconds`` (the same per pool), ``finished`` (columns ``index``,
            ``arrival_s``, ``ttft_ms``, ``itl_ms`` (a request's mean gap between tokens;
            ``None`` under two tokens), ``input_length``, ``replica`` (disaggregated: the
            decode replica), ``prefill_replica`` (``None`` aggregated or prefilled
            locally)) and ``replicas``
            (each ``id``, ``role``, ``state``, ``ready_s``, ``running``, ``waiting``,
            ``kv_active_blocks``).

        Raises:
            ValueError: a replica can no longer make progress.
        """
    def set_replicas(self, n: int, role: str | None = None) -> None:
        """Resize to ``n`` replicas starting or ready (see the class); ``role``
        (``"prefill"`` or ``"decode"``) names the pool of a disaggregated lab.

        Raises:
            ValueError: ``role`` is not one of the lab's pools, or missing in a
                disaggregated lab.
        """
    def counts(self, role: str | None = None) -> tuple[int, int, int]:
        """Replicas ``(starting, ready, draining)``, of ``role``'s pool when given.

        Raises:
            ValueError: ``role`` is not one of the lab's pools.
        """
    @property
    def roles(self) -> list[str]:
        """The pools: ``["agg"]``, or ``["prefill", "decode"]``."""
    @property
    def now_s(self) -> float:
        """The simulated time, seconds."""
    @property
    def last_arrival_s(self) -> float:
        """The last request's arrival, seconds."""
    @property
    def done(self) -> bool:
        """Whether every request has arrived and ended."""
    @property
    def replica_seconds(self) -> float:
        """Replica-seconds spent so far (each replica from being asked for until gone)."""
    @property
    def role_seconds(self) -> dict[str, float]:
        """Replica-seconds spent so far, per pool."""

def planner_lab_point(
    isl: int,
    osl: int,
    concurrency: int,
    requests: int,
    quantile: float = 0.9,
    engine_args: str | None = None,
    *,
    role: str = "agg",
) -> dict[str, float]:
    """One simulated replica holding ``concurrency`` requests of ``isl`` prompt tokens
    (unique) and ``osl`` output tokens at all times until ``requests`` have finished,
    the first ``concurrency`` left out; without the GIL. ``role`` is what the replica
    does in a disaggregated lab: ``"prefill"``, one-token requests (``osl`` not used; the
    ITL is 0); ``"decode"``, each prompt's full blocks cached when it arrives (handed
    over); ``"agg"``, both.

    Returns:
        ``ttft_ms`` and ``itl_ms`` (a request's mean gap between tokens) at
        ``quantile``, and ``throughput_rps``.

    Raises:
        ValueError: a setting is out of range, or ``role`` is not one.
    """

# Output parsers (docs/tools.md): tool calls and reasoning split out of a model's text,
# by vLLM's parser names. Malformed calls, and calls of functions outside ``tools``,
# come back as content.

def parse_tool_calls(
    parser: str, text: str, tools: list[str] | None = None
) -> tuple[str | None, list[dict[str, str]]]:
    """Split a whole response into its content and its tool calls.

    Arguments:
        parser: a name in ``TOOL_CALL_PARSERS`` (``hermes``, ``llama3_json``, ...).
        text: the model's output, special tokens kept.
        tools: the names of the request's functions; a call of another name is
            content. ``None`` accepts any name.

    Returns:
        ``(content, calls)``: content ``None`` when there is none; each call
        ``{"name": ..., "arguments": ...}``, the arguments a JSON text.

    Raises:
        ValueError: an unknown parser name (the message lists the known ones).
    """

def parse_reasoning(parser: str, text: str, enable_thinking: bool = True) -> tuple[str | None, str | None]:
    """Split a whole response into its reasoning and its answer.

    Arguments:
        parser: a name in ``REASONING_PARSERS`` (``deepseek_r1``, ``qwen3``).
        text: the model's output.
        enable_thinking: the request's ``chat_template_kwargs.enable_thinking``
            (``qwen3``: off makes everything content).

    Returns:
        ``(reasoning, content)``, each ``None`` when empty.

    Raises:
        ValueError: an unknown parser name (the message lists the known ones).
    """

@final
class ToolCallStream:
    """An incremental tool-call parser for one streamed response: each text delta is
    seen once. A call comes out whole (``index``, ``id``, ``type``, ``function.name``,
    ``function.arguments``) when its closing markup arrives and it checks out.

    Raises:
        ValueError: an unknown parser name (the message lists the known ones).
    """

    def __new__(cls, parser: str, tools: list[str] | None = None) -> ToolCallStream: ...
    def push(self, delta: str) -> tuple[str, list[dict[str, Any]]]:
        """Feed a text delta; returns ``(content, tool_calls)`` (OpenAI delta shape)."""

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """The stream has ended: what was held back, as ``push`` returns it."""

    @property
    def cut(self) -> bool:
        """After ``finish``: whether the stream ended inside tool-call markup (the
        unfinished part came back as content); the response is not complete."""

@final
class ReasoningStream:
    """An incremental reasoning parser for one streamed response.

    Raises:
        ValueError: an unknown parser name (the message lists the known ones).
    """

    def __new__(cls, parser: str, enable_thinking: bool = True) -> ReasoningStream: ...
    def push(self, delta: str) -> tuple[str, str]:
        """Feed a text delta; returns ``(reasoning, content)``, either may be empty."""

    def finish(self) -> tuple[str, str]:
        """The stream has ended: what was held back, as ``push`` returns it."""

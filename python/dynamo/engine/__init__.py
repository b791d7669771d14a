"""One worker source for every engine: the engine-independent part of a Dynamo
token-level worker (flags, registration, the request handler's stream ends, the
disaggregated roles, the KV-event and load-metrics bridges, drain on shutdown), which
an engine fills in through one interface, :class:`EngineAdapter` (``docs/engines.md``).

``python -m dynamo.vllm``, ``python -m dynamo.sglang`` and ``python -m dynamo.trtllm``
are this base with their adapter. Importing this package imports no engine.
"""

from dynamo.engine.adapter import EngineAdapter, Failure, RequestError
from dynamo.engine.config import WorkerConfig
from dynamo.engine.kv_events import BlocksCleared, BlocksRemoved, BlocksStored, KvEvent, ZmqKvEvents

__all__ = [
    "BlocksCleared",
    "BlocksRemoved",
    "BlocksStored",
    "EngineAdapter",
    "Failure",
    "KvEvent",
    "RequestError",
    "WorkerConfig",
    "ZmqKvEvents",
]

"""Disaggregated serving: Frontend → Processor → Worker (decode role) → PrefillWorker.
The Worker prefills short prompts itself and sends long ones (uncached part over
``max-local-prefill-length``, while the prefill queue is short) to the PrefillWorker,
receiving their KV cache (docs/disagg.md).

    cd examples/llm && dynamo serve graphs.disagg:Frontend -f configs/disagg.yaml
"""

from components.frontend import Frontend
from components.prefill_worker import PrefillWorker
from components.processor import Processor
from components.worker import Worker

Frontend.link(Processor).link(Worker).link(PrefillWorker)

__all__ = ["Frontend", "PrefillWorker", "Processor", "Worker"]

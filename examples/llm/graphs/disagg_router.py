"""Disaggregated serving with a router: Frontend → Processor → Router → Worker (decode
role) → PrefillWorker. The Router picks the decode Worker by prefix (so the cached part
of a prompt, which the decision rule subtracts, is large); the Worker sends long
uncached prefills to the PrefillWorker (docs/disagg.md).

    cd examples/llm && dynamo serve graphs.disagg_router:Frontend -f configs/disagg_router.yaml
"""

from components.frontend import Frontend
from components.prefill_worker import PrefillWorker
from components.processor import Processor
from components.router import Router
from components.worker import Worker

Frontend.link(Processor).link(Router).link(Worker).link(PrefillWorker)

__all__ = ["Frontend", "PrefillWorker", "Processor", "Router", "Worker"]

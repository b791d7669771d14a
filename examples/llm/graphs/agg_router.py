"""Aggregated serving with a router: Frontend → Processor → Router → Worker. The
Processor asks the Router which Worker instance gets each request.

    cd examples/llm && dynamo serve graphs.agg_router:Frontend -f configs/agg_router.yaml
"""

from components.frontend import Frontend
from components.processor import Processor
from components.router import Router
from components.worker import Worker

Frontend.link(Processor).link(Router).link(Worker)

__all__ = ["Frontend", "Processor", "Router", "Worker"]

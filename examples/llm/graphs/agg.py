"""Aggregated serving: Frontend → Processor → Worker (round-robin over the workers).

    cd examples/llm && dynamo serve graphs.agg:Frontend -f configs/agg.yaml
"""

from components.frontend import Frontend
from components.processor import Processor
from components.worker import Worker

Frontend.link(Processor).link(Worker)

__all__ = ["Frontend", "Processor", "Worker"]

"""The LLM graph's components: Frontend, Processor, Router and Worker. Each runs alone
with ``python -m components.<name>`` (from ``examples/llm``) or in a graph under
``dynamo serve graphs.<graph>:Frontend``."""

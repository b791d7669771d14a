"""The SLA planner: sizes a fleet of workers to its latency targets (docs/planner.md).

Observe (``observe``) → predict (``predict``) → model (``profile``) → decide (``decide``)
→ execute (``connector``); ``python -m dynamo.planner --config planner.yaml`` runs it.
"""

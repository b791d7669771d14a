"""KV-cache-aware routing from Python: the routing lab (``python -m dynamo.router.lab``,
see docs/kv-routing.md)."""

"""SGLang as a Dynamo engine: ``python -m dynamo.sglang`` serves an ``sglang.Engine`` as a
token-level worker through the worker base (``dynamo.engine``; see ``docs/engines.md``).
Importing this package does not import SGLang; its modules do, when they run."""

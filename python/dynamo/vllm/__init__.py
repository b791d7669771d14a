"""vLLM as a Dynamo engine: ``python -m dynamo.vllm`` serves a vLLM ``AsyncLLM`` as a
token-level worker (see ``docs/vllm.md``). Importing this package does not import vLLM;
its modules do, when they run."""

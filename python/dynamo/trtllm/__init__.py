"""TensorRT-LLM as a Dynamo engine: ``python -m dynamo.trtllm`` serves a
``tensorrt_llm.LLM`` as a token-level worker through the worker base (``dynamo.engine``;
see ``docs/engines.md``). Importing this package does not import TensorRT-LLM."""

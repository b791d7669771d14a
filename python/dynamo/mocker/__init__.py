"""The mocker worker: ``python -m dynamo.mocker --model-path DIR [--num-workers N]``
serves a simulated paged-KV-cache LLM engine (see docs/mocker.md) on a Dynamo endpoint
and registers the model so that ``dynamo-run in=http out=dyn`` serves it."""

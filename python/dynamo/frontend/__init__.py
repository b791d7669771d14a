"""The OpenAI HTTP frontend as a component: ``python -m dynamo.frontend [flags]`` serves
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models`` and ``/health`` for the models
workers register in discovery (it runs ``dynamo-run in=http out=dyn`` in this process)."""

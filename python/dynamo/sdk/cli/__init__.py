"""The ``dynamo`` command: ``dynamo serve`` (a process supervisor for service graphs) and
``dynamo run`` (``dynamo-run``)."""

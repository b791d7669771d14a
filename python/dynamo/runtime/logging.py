"""``configure_dynamo_logging``: one log format for every Dynamo process's Python code.

```python
from dynamo.runtime.logging import configure_dynamo_logging
configure_dynamo_logging(service_name="Processor", worker_id=0)
```

The level follows ``DYN_LOG`` (the Rust side's variable: ``error``, ``warn``, ``info``
(default), ``debug``, ``trace``; only its global level is read, not per-crate filters).
"""

from __future__ import annotations

import logging
import os
import sys

#: ``DYN_LOG`` levels as Python levels.
_LEVELS = {
    "error": logging.ERROR,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
    "trace": logging.DEBUG,
}
_HANDLER_NAME = "dynamo"


def log_level(spec: str | None = None) -> int:
    """The Python level of a ``DYN_LOG`` value (default: the environment's, else info).
    Per-target filters (``info,dynamo_llm=debug``) are ignored past the first global level."""
    spec = os.environ.get("DYN_LOG", "info") if spec is None else spec
    for part in spec.split(","):
        part = part.strip().lower()
        if part and "=" not in part:
            return _LEVELS.get(part, logging.INFO)
    return logging.INFO


def configure_dynamo_logging(service_name: str | None = None, worker_id: int | None = None) -> None:
    """Send the root logger's records to stderr as ``time level [service:worker] logger:
    message`` at the ``DYN_LOG`` level. Calling it again replaces the previous setup."""
    tag = ""
    if service_name is not None:
        tag = f"[{service_name}]" if worker_id is None else f"[{service_name}:{worker_id}]"
    fmt = "%(asctime)s %(levelname)s " + (f"{tag} " if tag else "") + "%(name)s: %(message)s"
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(logging.Formatter(fmt))
    root.addHandler(handler)
    root.setLevel(log_level())

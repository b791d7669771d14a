"""Dynamo: a distributed runtime for serving large language models.

The low-level API lives in :mod:`dynamo.runtime`; the compiled core is ``dynamo._core``.
"""

from dynamo._core import __version__

__all__ = ["__version__"]

"""Pinned Python requirements of a graph, from the running environment.

The rule: ``ai-dynamo`` at the installed version, plus every installed distribution that
provides a top-level module the graph's source files import (absolute imports), at its
installed version. The standard library, the graph's own modules and modules no installed
distribution provides (an engine the base image brings) are left out; imports made
dynamically (``importlib.import_module``) are not seen.
"""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Iterable

DYNAMO_DISTRIBUTION = "ai-dynamo"


def pinned_requirements(imported: Iterable[str], local: Iterable[str]) -> tuple[list[str], list[str]]:
    """(``name==version`` lines, sorted; the imported names no distribution provides)."""
    providers = importlib.metadata.packages_distributions()
    skip = set(sys.stdlib_module_names) | set(local) | {"__future__"}
    pins = {DYNAMO_DISTRIBUTION: importlib.metadata.version(DYNAMO_DISTRIBUTION)}
    unknown: list[str] = []
    for name in sorted(set(imported) - skip):
        distributions = providers.get(name)
        if not distributions:
            unknown.append(name)
            continue
        for distribution in distributions:
            canonical = distribution.lower().replace("_", "-")
            pins[canonical] = importlib.metadata.version(distribution)
    return [f"{name}=={version}" for name, version in sorted(pins.items())], unknown

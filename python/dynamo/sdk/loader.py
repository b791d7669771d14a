"""Find the service a ``module:Service`` (or ``path/file.py:Service``) string names."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

from dynamo.sdk.service import DynamoService


def import_module(module_ref: str, working_dir: str | Path = ".") -> Any:
    """Import ``module_ref`` (dotted name or a ``.py`` path) with ``working_dir`` on ``sys.path``."""
    root = str(Path(working_dir).resolve())
    if root not in sys.path:
        sys.path.insert(0, root)
    if module_ref.endswith(".py"):
        path = (Path(root) / module_ref).resolve()
        try:
            module_ref = ".".join(path.relative_to(root).with_suffix("").parts)
        except ValueError:
            sys.path.insert(0, str(path.parent))
            module_ref = path.stem
    return importlib.import_module(module_ref)


def load_service(ref: str, working_dir: str | Path = ".") -> DynamoService:
    """The service ``ref`` names: ``module:Attr``, or ``module`` alone when the module
    has exactly one service no other service depends on."""
    module_ref, _, attr = ref.partition(":")
    module = import_module(module_ref, working_dir)
    if attr:
        target: Any = module
        for part in attr.split("."):
            target = getattr(target, part, None)
            if target is None:
                raise ValueError(f"{module_ref} has no attribute {attr!r}")
        if not isinstance(target, DynamoService):
            raise ValueError(f"{ref} is not a @service class (got {target!r})")
        return target
    services = [v for v in vars(module).values() if isinstance(v, DynamoService)]
    used = {id(d.on) for s in services for d in s.used_dependencies().values()}
    roots = [s for s in services if id(s) not in used]
    if len(roots) != 1:
        names = [s.name for s in roots]
        raise ValueError(f"{module_ref} has {len(roots)} root services {names}; name one as {module_ref}:<Service>")
    return roots[0]

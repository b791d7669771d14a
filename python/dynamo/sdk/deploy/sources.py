"""The graph's source files: what ``dynamo build`` copies into an artifact.

The rule: after the graph is imported, every module loaded from the working directory
counts; a module inside a package brings every ``.py`` file of its package directory
(a module imported lazily, inside a function, is still there) and the ``__init__.py`` of
each package above it; a top-level module brings itself. Nothing else (no data files).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path


def graph_sources(working_dir: Path) -> list[Path]:
    """The source files (relative to ``working_dir``, sorted) of the modules imported from it."""
    root = working_dir.resolve()
    files: set[Path] = set()
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if not file:
            continue
        path = Path(file).resolve()
        if path.suffix != ".py" or not path.is_relative_to(root):
            continue
        rel = path.relative_to(root)
        if len(rel.parts) == 1:
            files.add(rel)
            continue
        package = rel.parent
        files.update(p.relative_to(root) for p in (root / package).glob("*.py"))
        for parent in package.parents:
            if parent != Path(".") and (root / parent / "__init__.py").is_file():
                files.add(parent / "__init__.py")
    return sorted(files)


def imported_top_level_names(source: str) -> set[str]:
    """The top-level names the source's absolute imports name (``import a.b`` → ``a``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names

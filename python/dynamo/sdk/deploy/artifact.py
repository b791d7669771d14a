"""``dynamo build``'s artifact: a directory that holds everything a cluster needs to run a
graph, named and tagged by the digest of its content.

Layout (``<out>/<graph>-<tag>/``)::

    src/…              the graph's source files (``sources.py``'s rule)
    config.yaml        the merged configuration (file + overrides), as dynamo serve passes it
    requirements.txt   pinned requirements (``requirements.py``'s rule)
    Dockerfile         base image and our wheel as build arguments
    dynamo.yaml        services (entry points, endpoints, workers, resources, resolved
                       configuration), edges, every file's SHA-256; the tag and digest

``dynamo.yaml`` lists every other file with its SHA-256; the digest is the SHA-256 of
``dynamo.yaml`` without its ``tag``/``digest`` keys (keys sorted), so it covers every
file's path and content, and mtimes and the machine's paths play no part. Files are
written with mode 0644 and a fixed mtime, so an archive of the directory is reproducible
too. Files added later (a wheel for the image build) are not part of the artifact.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dynamo.sdk.deploy import requirements, sources
from dynamo.sdk.deploy.dockerfile import dockerfile
from dynamo.sdk.deploy.errors import DeployError, DeployErrorKind
from dynamo.sdk.deploy.graph import ResolvedGraph

MANIFEST = "dynamo.yaml"
CONFIG = "config.yaml"
SOURCE_DIR = "src"
FORMAT = 1
#: Characters of the hex digest that make the tag.
TAG_LENGTH = 16
#: The mtime of every file (1980-01-01, as wheels use: the earliest a zip can hold).
FIXED_MTIME = 315532800
FILE_MODE = 0o644


@dataclass(frozen=True)
class Artifact:
    """A built artifact on disk."""

    path: Path
    manifest: dict[str, Any]

    @property
    def tag(self) -> str:
        """The artifact's tag (the digest's first characters)."""
        return str(self.manifest["tag"])

    @property
    def image(self) -> str:
        """The image reference the artifact's Dockerfile is built as: ``dynamo-<graph>:<tag>``."""
        return f"dynamo-{self.manifest['name']}:{self.tag}"

    def config(self) -> dict[str, Any]:
        """The configuration the artifact was built with."""
        value = yaml.safe_load((self.path / CONFIG).read_text()) or {}
        if not isinstance(value, dict):
            raise DeployError(DeployErrorKind.ARTIFACT, f"{self.path / CONFIG} is not a mapping")
        return value


def _manifest(graph: ResolvedGraph) -> dict[str, Any]:
    services = []
    edges = []
    for service in graph.services:
        args = service.plan.args
        entry: dict[str, Any] = {
            "name": service.name,
            "namespace": service.plan.namespace,
            "role": service.role,
            "entrypoint": list(service.command),
            "endpoints": list(service.endpoints),
            "workers": service.plan.workers,
            "resources": dict(args.resources),
            # What the service runs with (as `dynamo serve --dry-run` prints it).
            "config": service.plan.config,
        }
        if service.http_port is not None:
            entry["http_port"] = service.http_port
        services.append(entry)
        edges += [{"from": service.name, "to": target} for target in service.calls]
    return {
        "format": FORMAT,
        "name": graph.name,
        "graph": graph.pipeline,
        "config": CONFIG,
        "source": SOURCE_DIR,
        "services": services,
        "edges": edges,
    }


def _digest(manifest: dict[str, Any]) -> str:
    return hashlib.sha256(_dump(manifest).encode()).hexdigest()


def _file_hashes(files: dict[str, bytes]) -> dict[str, str]:
    return {path: f"sha256:{hashlib.sha256(content).hexdigest()}" for path, content in sorted(files.items())}


def _dump(value: Any) -> str:
    return yaml.safe_dump(value, sort_keys=True, default_flow_style=False, width=1000)


def build(graph: ResolvedGraph, working_dir: Path, out_dir: Path) -> tuple[Artifact, list[str]]:
    """Write ``graph``'s artifact under ``out_dir``; returns it and warnings (imports no
    installed distribution provides). The same input gives the same directory and tag."""
    root = working_dir.resolve()
    files: dict[str, bytes] = {}
    imported: set[str] = set()
    rel_sources = sources.graph_sources(root)
    for rel in rel_sources:
        content = (root / rel).read_bytes()
        files[f"{SOURCE_DIR}/{rel.as_posix()}"] = content
        imported |= sources.imported_top_level_names(content.decode())
    local = {rel.parts[0].removesuffix(".py") for rel in rel_sources}
    pins, unknown = requirements.pinned_requirements(imported, local)
    dynamo_pin = next(p for p in pins if p.startswith(f"{requirements.DYNAMO_DISTRIBUTION}=="))
    files["requirements.txt"] = ("\n".join(pins) + "\n").encode()
    files["Dockerfile"] = dockerfile(graph.name, dynamo_pin).encode()
    files[CONFIG] = _dump(graph.config).encode()
    manifest = {**_manifest(graph), "files": _file_hashes(files)}
    digest = _digest(manifest)
    tag = digest[:TAG_LENGTH]
    files[MANIFEST] = _dump({**manifest, "tag": tag, "digest": f"sha256:{digest}"}).encode()
    target = out_dir / f"{graph.name}-{tag}"
    if not target.exists():
        _write_atomically(target, files)
    artifact = load(target)  # and verify what is there
    warnings = [f"{name!r} is imported by the graph but no installed distribution provides it" for name in unknown]
    return artifact, warnings


def _write_atomically(target: Path, files: dict[str, bytes]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for rel, content in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
            path.chmod(FILE_MODE)
            os.utime(path, (FIXED_MTIME, FIXED_MTIME))
        for directory in sorted((p for p in staging.rglob("*") if p.is_dir()), reverse=True):
            directory.chmod(0o755)
            os.utime(directory, (FIXED_MTIME, FIXED_MTIME))
        staging.chmod(0o755)
        os.utime(staging, (FIXED_MTIME, FIXED_MTIME))
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def is_artifact(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory ``dynamo build`` wrote."""
    return (Path(path) / MANIFEST).is_file()


def load(path: str | os.PathLike[str]) -> Artifact:
    """The artifact at ``path``, its digest checked against its content."""
    root = Path(path)
    try:
        manifest = yaml.safe_load((root / MANIFEST).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise DeployError(DeployErrorKind.ARTIFACT, f"{root}: no readable {MANIFEST}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or "digest" not in manifest:
        raise DeployError(
            DeployErrorKind.ARTIFACT, f"{root / MANIFEST} is not a dynamo build manifest (format {FORMAT})"
        )
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        raise DeployError(DeployErrorKind.ARTIFACT, f"{root / MANIFEST} lists no files")
    try:
        files = {rel: (root / rel).read_bytes() for rel in listed}
    except OSError as exc:
        raise DeployError(DeployErrorKind.ARTIFACT, f"{root}: a file of the artifact is missing: {exc}") from exc
    bare = {k: v for k, v in manifest.items() if k not in ("tag", "digest")}
    digest = _digest(bare)
    if (
        _file_hashes(files) != listed
        or manifest["digest"] != f"sha256:{digest}"
        or manifest.get("tag") != digest[:TAG_LENGTH]
    ):
        raise DeployError(
            DeployErrorKind.ARTIFACT,
            f"{root}: its content does not match its digest {manifest['digest']} (altered after dynamo build?)",
        )
    return Artifact(path=root, manifest=manifest)

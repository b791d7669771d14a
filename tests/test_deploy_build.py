"""`dynamo build`: a reproducible artifact (two builds, one digest; a changed source file or
configuration, another), its dynamo.yaml, pinned requirements and Dockerfile, and
`dynamo deploy ARTIFACT` rendering exactly what `dynamo deploy GRAPH` renders, with the
artifact's tag as the image tag."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml
from helpers import EXAMPLES_DIR

LLM = EXAMPLES_DIR / "llm"
AGG = ["graphs.agg:Frontend", "-f", "configs/agg.yaml"]
TIMEOUT = 60


def dynamo(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DYNAMO_IMAGE", "DYNAMO_SERVICE_CONFIG")}
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.sdk.cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def build(cwd: Path, out: Path, *args: str) -> Path:
    path = Path(dynamo(cwd, "build", *args, "-o", str(out)).stdout.strip())
    assert path.parent == out and (path / "dynamo.yaml").is_file()
    return path


def manifest(artifact: Path) -> dict:
    return yaml.safe_load((artifact / "dynamo.yaml").read_text())


def test_two_builds_give_one_digest(tmp_path):
    first, second = build(LLM, tmp_path / "a", *AGG), build(LLM, tmp_path / "b", *AGG)
    assert first.name == second.name and first.name == f"agg-{manifest(first)['tag']}"
    assert manifest(first) == manifest(second)
    assert manifest(first)["digest"].startswith(f"sha256:{manifest(first)['tag']}")
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(second) for p in second.rglob("*") if p.is_file())
    for rel in files:
        assert (first / rel).read_bytes() == (second / rel).read_bytes(), rel
        stat = (first / rel).stat()
        assert stat.st_mode & 0o777 == 0o644 and stat.st_mtime == 315532800, rel
    # Building again into the same place keeps the artifact as it is.
    assert build(LLM, tmp_path / "a", *AGG) == first


def test_a_changed_source_file_or_configuration_gives_another_digest(tmp_path):
    source = tmp_path / "llm"
    shutil.copytree(LLM, source, ignore=shutil.ignore_patterns("__pycache__"))
    before = build(source, tmp_path / "out", *AGG)
    processor = source / "components" / "processor.py"
    processor.write_text(processor.read_text() + "\n# changed\n")
    after = build(source, tmp_path / "out", *AGG)
    assert manifest(after)["tag"] != manifest(before)["tag"]
    assert (after / "src/components/processor.py").read_text().endswith("# changed\n")
    overridden = build(source, tmp_path / "out", *AGG, "--Worker.ServiceArgs.workers=3")
    assert manifest(overridden)["tag"] not in (manifest(before)["tag"], manifest(after)["tag"])
    assert {s["name"]: s["workers"] for s in manifest(overridden)["services"]}["Worker"] == 3


def test_the_manifest_lists_services_entry_points_and_edges(tmp_path):
    artifact = build(LLM, tmp_path, *AGG)
    data = manifest(artifact)
    assert data["graph"] == "graphs.agg:Frontend" and data["name"] == "agg"
    services = {s["name"]: s for s in data["services"]}
    assert list(services) == ["Worker", "Processor", "Frontend"]
    assert services["Worker"]["entrypoint"] == ["python", "-m", "components.worker"]
    assert services["Worker"]["workers"] == 2 and services["Worker"]["resources"] == {"cpu": "1"}
    assert services["Worker"]["endpoints"] == ["generate"]
    assert services["Worker"]["config"]["speedup-ratio"] == 10
    assert services["Processor"]["entrypoint"][:4] == ["python", "-m", "dynamo.sdk.run", "graphs.agg:Frontend"]
    assert services["Frontend"]["role"] == "frontend" and services["Frontend"]["http_port"] == 8000
    assert data["edges"] == [{"from": "Processor", "to": "Worker"}, {"from": "Frontend", "to": "Processor"}]
    config = yaml.safe_load((artifact / "config.yaml").read_text())
    assert config == yaml.safe_load((LLM / "configs/agg.yaml").read_text())
    assert (artifact / "src/components/worker.py").read_bytes() == (LLM / "components/worker.py").read_bytes()
    assert not (artifact / "src/worker.py").exists()  # examples/llm/worker.py is not part of the graph
    for rel, digest in data["files"].items():
        assert (artifact / rel).is_file() and digest.startswith("sha256:")
    dockerfile = (artifact / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=" in dockerfile and "ARG DYNAMO_WHEEL=ai-dynamo==" in dockerfile


def test_requirements_pin_what_the_graph_imports(tmp_path):
    artifact = build(EXAMPLES_DIR / "hello_world", tmp_path, "hello_world:Frontend", "-f", "config.yaml")
    pins = (artifact / "requirements.txt").read_text().split()
    assert pins == sorted(pins)
    assert f"ai-dynamo=={importlib.metadata.version('ai-dynamo')}" in pins
    assert f"pydantic=={importlib.metadata.version('pydantic')}" in pins
    assert not [p for p in pins if p.split("==")[0] in ("collections", "typing", "hello-world")]


def test_deploy_from_the_artifact_renders_as_from_the_graph(tmp_path):
    artifact = build(LLM, tmp_path / "out", *AGG)
    tag = manifest(artifact)["tag"]
    from_artifact = dynamo(tmp_path, "deploy", str(artifact)).stdout
    from_graph = dynamo(LLM, "deploy", *AGG, "--image", f"dynamo-agg:{tag}").stdout
    assert from_artifact == from_graph
    images = {
        c["image"]
        for o in yaml.safe_load_all(from_artifact) if o["kind"] == "Deployment"
        for c in o["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"dynamo-agg:{tag}"}
    pushed = dynamo(tmp_path, "deploy", str(artifact), "--registry", "registry.example.com/team").stdout
    assert f"image: registry.example.com/team/dynamo-agg:{tag}" in pushed
    # A config file and overrides apply over the artifact's configuration, as for serve.
    scaled = dynamo(tmp_path, "deploy", str(artifact), "--Worker.ServiceArgs.workers=5").stdout
    worker = next(o for o in yaml.safe_load_all(scaled) if o["metadata"]["name"] == "agg-worker"
                  and o["kind"] == "Deployment")
    assert worker["spec"]["replicas"] == 5
    assert not list(artifact.rglob("__pycache__"))


def test_an_altered_artifact_is_refused(tmp_path):
    artifact = build(LLM, tmp_path, *AGG)
    processor = artifact / "src/components/processor.py"
    processor.chmod(0o644)
    processor.write_text(processor.read_text() + "\n# tampered\n")
    proc = dynamo(tmp_path, "deploy", str(artifact), check=False)
    assert proc.returncode == 2 and "does not match its digest" in proc.stderr, proc.stderr

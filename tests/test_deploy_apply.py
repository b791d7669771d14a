"""`dynamo deploy --apply` against recorded API-server responses: a loopback HTTP server in
the test answers the official client's requests with the bodies in tests/data/k8s
(hand-recorded, in the Kubernetes API's shapes), through a kubeconfig pointing at it. It
checks the requests (server-side apply: PATCH, application/apply-patch+yaml, fieldManager
dynamo, force, the context's namespace and token), the progress lines and the bounded
wait. The last test runs for real when KUBECONFIG points at a reachable cluster."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import EXAMPLES_DIR
from k8s_api import NOT_FOUND, TOKEN, Request, recorded, serve_recorded, write_kubeconfig

pytest.importorskip("kubernetes")

LLM = EXAMPLES_DIR / "llm"
AGG = ["graphs.agg:Frontend", "-f", "configs/agg.yaml"]
DEPLOYMENTS = ["agg-frontend", "agg-processor", "agg-worker"]
#: Bound on one `dynamo deploy --apply` run in these tests.
RUN_TIMEOUT = 60


def deployment_body(name: str, state: str, replicas: int) -> dict[str, Any]:
    """The recorded Deployment (`progressing` or `ready`) renamed and resized."""
    body = recorded(f"deployment-{state}.json")
    body["metadata"]["name"] = name
    body["spec"]["replicas"] = body["status"]["replicas"] = body["status"]["updatedReplicas"] = replicas
    if state == "ready":
        body["status"]["readyReplicas"] = body["status"]["availableReplicas"] = replicas
    else:
        body["status"]["unavailableReplicas"] = replicas
    return body


@dataclass
class RecordedApiServer:
    """Answers PATCH with the applied object plus recorded server metadata (or a recorded
    failure), and GET with the next of a path's recorded bodies (the last one repeats)."""

    gets: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    failures: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.requests.append(request)
            if request.path in self.failures:
                return self.failures[request.path]
            if request.method == "PATCH":
                body = copy.deepcopy(request.body)
                body["metadata"].update(recorded("apply-metadata.json"))
                return 200, body
            bodies = self.gets.get(request.path)
            if not bodies:
                return NOT_FOUND
            return 200, bodies.pop(0) if len(bodies) > 1 else bodies[0]


@pytest.fixture
def api_server() -> Iterator[tuple[RecordedApiServer, str]]:
    recorder = RecordedApiServer()
    with serve_recorded(recorder.answer) as url:
        yield recorder, url


def kubeconfig(tmp_path: Path, server: str) -> Path:
    return write_kubeconfig(tmp_path / "kubeconfig", server)


def deploy_apply(config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DYNAMO_IMAGE", "DYNAMO_SERVICE_CONFIG")}
    env["KUBECONFIG"] = str(config)
    return subprocess.run(
        [sys.executable, "-m", "dynamo.sdk.cli.main", "deploy", *AGG, "--apply", *args],
        cwd=LLM, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )


def deployment_path(name: str, namespace: str = "team") -> str:
    return f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"


def rendered_objects() -> list[dict[str, Any]]:
    text = (Path(__file__).parent / "deploy_golden" / "llm_agg.yaml").read_text()
    return list(yaml.safe_load_all(text))


def test_apply_is_server_side_apply_then_waits_for_ready(tmp_path, api_server):
    recorder, server = api_server
    replicas = {"agg-frontend": 1, "agg-processor": 1, "agg-worker": 2}
    for name in DEPLOYMENTS:
        recorder.gets[deployment_path(name)] = [
            deployment_body(name, "progressing", replicas[name]),
            deployment_body(name, "ready", replicas[name]),
        ]
    proc = deploy_apply(kubeconfig(tmp_path, server), "--timeout", "30")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    patches = [r for r in recorder.requests if r.method == "PATCH"]
    objects = rendered_objects()
    assert [p.body["metadata"]["name"] for p in patches] == [o["metadata"]["name"] for o in objects]
    for patch, obj in zip(patches, objects, strict=True):
        assert patch.headers["content-type"] == "application/apply-patch+yaml"
        assert patch.query == {"fieldManager": "dynamo", "force": "true"}
        assert patch.headers["authorization"] == f"Bearer {TOKEN}"
        assert patch.body == {**obj, "metadata": {**obj["metadata"], "namespace": "team"}}
    assert patches[0].path == "/apis/apps/v1/namespaces/team/statefulsets/agg-etcd"
    assert "/api/v1/namespaces/team/configmaps/agg-worker-config" in [p.path for p in patches]
    assert "/apis/policy/v1/namespaces/team/poddisruptionbudgets/agg-worker" in [p.path for p in patches]
    # Then it waits: every GET comes after the last PATCH, for each Deployment.
    methods = [r.method for r in recorder.requests]
    assert methods == ["PATCH"] * len(patches) + ["GET"] * (len(methods) - len(patches))
    gets = [r.path for r in recorder.requests if r.method == "GET"]
    assert sorted(set(gets)) == [deployment_path(n) for n in DEPLOYMENTS]
    lines = proc.stderr.splitlines()
    assert "applied Deployment/agg-worker in team" in lines
    assert any("0/3 deployments ready: agg-frontend 0/1, agg-processor 0/1, agg-worker 0/2" in line for line in lines)
    assert any("3/3 deployments ready: agg-frontend 1/1, agg-processor 1/1, agg-worker 2/2" in line for line in lines)
    assert lines[-1] == "3 deployments ready in team"


def test_apply_gives_up_after_the_timeout_naming_what_is_not_ready(tmp_path, api_server):
    recorder, server = api_server
    for name in DEPLOYMENTS:
        state = "progressing" if name == "agg-worker" else "ready"
        recorder.gets[deployment_path(name, "prod")] = [deployment_body(name, state, 2 if name == "agg-worker" else 1)]
    started = time.monotonic()
    proc = deploy_apply(kubeconfig(tmp_path, server), "--timeout", "1", "--namespace", "prod")
    assert proc.returncode == 1, proc.stderr
    assert "not ready after 1s: agg-worker 0/2" in proc.stderr
    assert time.monotonic() - started < RUN_TIMEOUT
    # --namespace wins over the context's.
    assert all("/namespaces/prod/" in r.path for r in recorder.requests)


def test_an_api_error_stops_the_apply_with_its_message(tmp_path, api_server):
    recorder, server = api_server
    recorder.failures[deployment_path("agg-frontend")] = (403, recorded("status-forbidden.json"))
    proc = deploy_apply(kubeconfig(tmp_path, server))
    assert proc.returncode == 1
    assert "403" in proc.stderr and "cannot patch resource" in proc.stderr, proc.stderr
    # Nothing after the refused object is applied, and nothing is awaited.
    assert recorder.requests[-1].path == deployment_path("agg-frontend")
    assert not [r for r in recorder.requests if r.method == "GET"]


def test_server_dry_run_changes_nothing_and_waits_for_nothing(tmp_path, api_server):
    recorder, server = api_server
    proc = deploy_apply(kubeconfig(tmp_path, server), "--server-dry-run")
    assert proc.returncode == 0, proc.stderr
    assert recorder.requests and all(r.method == "PATCH" for r in recorder.requests)
    assert all(r.query.get("dryRun") == "All" for r in recorder.requests)


def test_an_unreachable_api_server_is_a_clear_error(tmp_path):
    from helpers import free_port

    proc = deploy_apply(kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}"))
    assert proc.returncode == 1 and "does not answer" in proc.stderr, proc.stderr


def test_a_missing_kubeconfig_is_a_clear_error(tmp_path):
    proc = deploy_apply(tmp_path / "absent")
    assert proc.returncode == 1 and "cannot load the kubeconfig" in proc.stderr, proc.stderr


def _reachable_cluster() -> str | None:
    """Why the real-cluster test cannot run, or None when it can."""
    config = os.environ.get("KUBECONFIG")
    if not config or not Path(config.split(os.pathsep)[0]).is_file():
        return "KUBECONFIG does not point at a kubeconfig file"
    try:
        from kubernetes import client
        from kubernetes import config as kube_config

        api = kube_config.new_client_from_config()
        client.VersionApi(api).get_code(_request_timeout=5)
    except Exception as exc:
        return f"the cluster in KUBECONFIG is not reachable: {exc}"
    return None


def test_apply_to_a_real_cluster():
    """On a real cluster the API server itself checks every object (server-side dry run:
    nothing changes)."""
    reason = _reachable_cluster()
    if reason:
        pytest.skip(reason)
    env = {k: v for k, v in os.environ.items() if k not in ("DYNAMO_IMAGE", "DYNAMO_SERVICE_CONFIG")}
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.sdk.cli.main", "deploy", *AGG, "--apply", "--server-dry-run"],
        cwd=LLM, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("(server dry run)") == len(rendered_objects())

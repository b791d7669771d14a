"""The kubernetes connector against recorded API-server responses (a loopback server
answering the official client through a kubeconfig, as tests/test_deploy_apply.py does):
it finds the role's Deployment by its labels, reads ready/pending replicas, and patches
the scale subresource. The last test runs on a real cluster when KUBECONFIG points at one."""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from k8s_api import NOT_FOUND, TOKEN, Request, recorded, serve_recorded, write_kubeconfig

pytest.importorskip("kubernetes")

from dynamo.planner.config import build_config
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.connectors.kubernetes import KubernetesConnector

LIST_PATH = "/apis/apps/v1/namespaces/team/deployments"
SCALE_PATH = "/apis/apps/v1/namespaces/team/deployments/agg-worker/scale"


def deployment_list(*items: dict[str, Any]) -> dict[str, Any]:
    return {"kind": "DeploymentList", "apiVersion": "apps/v1", "metadata": {"resourceVersion": "48400"},
            "items": list(items)}


@dataclass
class Recorded:
    answers: dict[tuple[str, str], tuple[int, dict[str, Any]]] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)

    def answer(self, request: Request) -> tuple[int, dict[str, Any]]:
        self.requests.append(request)
        return self.answers.get((request.method, request.path), NOT_FOUND)


@pytest.fixture
def api_server(tmp_path: Path) -> Iterator[tuple[Recorded, Path]]:
    """A loopback API server answering (method, path) with recorded bodies, and a
    kubeconfig pointing at it (context namespace `team`)."""
    recorder = Recorded()
    with serve_recorded(recorder.answer) as url:
        yield recorder, write_kubeconfig(tmp_path / "kubeconfig", url)


def planner_config(graph: str = "agg") -> Any:
    return build_config({
        "model": "m", "connector": {"kind": "kubernetes", "graph": graph},
        "roles": {"agg": {"service": "Worker", "max_replicas": 4}},
    })


def connector(config_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubernetesConnector:
    """The connector on the recorded server (the kubernetes client reads KUBECONFIG when
    imported, so the test hands it a client of its kubeconfig and the context's namespace)."""
    from kubernetes import config

    return KubernetesConnector(planner_config(), config.new_client_from_config(str(config_path)), "team")


async def test_reads_replicas_and_scales_through_the_subresource(api_server, monkeypatch) -> None:
    recorder, config_path = api_server
    progressing = recorded("deployment-progressing.json")
    recorder.answers[("GET", LIST_PATH)] = (200, deployment_list(progressing))
    recorder.answers[("PATCH", SCALE_PATH)] = (200, recorded("scale-agg-worker.json"))
    k8s = connector(config_path, monkeypatch)
    states = await k8s.replicas()
    desired = progressing["spec"]["replicas"]
    ready = progressing["status"].get("readyReplicas") or 0
    assert (states["agg"].ready, states["agg"].pending) == (ready, desired - ready)
    listing = recorder.requests[0]
    assert listing.query["labelSelector"] == "dynamo.ai/graph=agg,dynamo.ai/service=Worker"
    assert listing.headers["authorization"] == f"Bearer {TOKEN}"

    await k8s.scale("agg", 3, "test")
    patch = recorder.requests[-1]
    assert (patch.method, patch.path) == ("PATCH", SCALE_PATH)
    assert patch.body == {"spec": {"replicas": 3}}
    assert "patch" in patch.headers["content-type"]


async def test_ready_deployment_has_no_pending_replicas(api_server, monkeypatch) -> None:
    recorder, config_path = api_server
    ready = recorded("deployment-ready.json")
    recorder.answers[("GET", LIST_PATH)] = (200, deployment_list(ready))
    states = await connector(config_path, monkeypatch).replicas()
    assert (states["agg"].ready, states["agg"].pending) == (ready["spec"]["replicas"], 0)


async def test_no_or_several_matching_deployments_is_an_error(api_server, monkeypatch) -> None:
    recorder, config_path = api_server
    k8s = connector(config_path, monkeypatch)
    recorder.answers[("GET", LIST_PATH)] = (200, deployment_list())
    with pytest.raises(ConnectorError, match="0 Deployments in team match") as error:
        await k8s.replicas()
    assert error.value.kind is ConnectorErrorKind.NOT_FOUND
    two = recorded("deployment-ready.json")
    other = copy.deepcopy(two)
    other["metadata"]["name"] = "agg-worker-2"
    recorder.answers[("GET", LIST_PATH)] = (200, deployment_list(two, other))
    with pytest.raises(ConnectorError, match="2 Deployments"):
        await k8s.scale("agg", 2, "test")
    assert all(r.method == "GET" for r in recorder.requests)


async def test_a_refused_scale_is_an_error_with_its_status(api_server, monkeypatch) -> None:
    recorder, config_path = api_server
    recorder.answers[("GET", LIST_PATH)] = (200, deployment_list(recorded("deployment-ready.json")))
    recorder.answers[("PATCH", SCALE_PATH)] = (403, recorded("status-forbidden.json"))
    with pytest.raises(ConnectorError, match="403") as error:
        await connector(config_path, monkeypatch).scale("agg", 1, "test")
    assert error.value.kind is ConnectorErrorKind.UNREACHABLE


def test_a_role_without_its_service_label_is_refused() -> None:
    config = build_config({"model": "m", "connector": {"kind": "kubernetes", "graph": "agg"}})
    with pytest.raises(ConnectorError, match=r"roles\.agg\.service is not set"):
        KubernetesConnector(config)


async def test_on_a_real_cluster() -> None:
    """Reads the replicas of a Deployment named by DYN_PLANNER_TEST_GRAPH and
    DYN_PLANNER_TEST_SERVICE (labels as `dynamo deploy` renders them) and sets them to
    what they are (changing nothing)."""
    config = os.environ.get("KUBECONFIG")
    if not config or not Path(config.split(os.pathsep)[0]).is_file():
        pytest.skip("KUBECONFIG does not point at a kubeconfig file")
    graph, service = os.environ.get("DYN_PLANNER_TEST_GRAPH"), os.environ.get("DYN_PLANNER_TEST_SERVICE")
    if not graph or not service:
        pytest.skip("DYN_PLANNER_TEST_GRAPH and DYN_PLANNER_TEST_SERVICE name no rendered Deployment")
    k8s = KubernetesConnector(build_config({
        "model": "m", "connector": {"kind": "kubernetes", "graph": graph}, "roles": {"agg": {"service": service}},
    }))
    state = (await k8s.replicas())["agg"]
    await k8s.scale("agg", state.total, "real-cluster test: no change")
    assert (await k8s.replicas())["agg"].total == state.total

"""`dynamo deploy --target kubernetes`: golden manifests of every graph in examples/
(re-rendered and compared), every object valid against the Kubernetes 1.34 to 1.37 schemas
in strict mode, and what the manifests promise: replicas and resources from the same
resolution as `dynamo serve` (@service and BaseDeployment alike, a config file and
overrides winning), probes/preStop/grace per the drain contract, PDBs, rolling updates,
the platform or existing endpoints, the Ingress.

Regenerate the goldens after an intended change (then review the diff):

    DYN_UPDATE_GOLDEN=1 pytest tests/test_deploy_manifests.py -k golden
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import EXAMPLES_DIR

kubernetes_validate = pytest.importorskip("kubernetes_validate")

GOLDEN_DIR = Path(__file__).parent / "deploy_golden"
#: The Kubernetes versions every object is validated against.
K8S_VERSIONS = ("1.34", "1.35", "1.36", "1.37")
RENDER_TIMEOUT = 60

#: (golden name, directory, graph, config file): every graph in examples/.
GRAPHS = [
    ("hello_world", "hello_world", "hello_world:Frontend", "config.yaml"),
    ("sdk_quickstart", "sdk_quickstart", "graph:Frontend", "config.yaml"),
    ("standalone", "standalone", "greeter:Greeter", "config.yaml"),
    ("llm_hello_world", "llm_hello_world", "llm_hello_world:Frontend", None),
    ("llm_agg", "llm", "graphs.agg:Frontend", "configs/agg.yaml"),
    ("llm_agg_vllm", "llm", "graphs.agg:Frontend", "configs/agg_vllm.yaml"),
    ("llm_agg_router", "llm", "graphs.agg_router:Frontend", "configs/agg_router.yaml"),
    ("llm_disagg", "llm", "graphs.disagg:Frontend", "configs/disagg.yaml"),
    ("llm_disagg_router", "llm", "graphs.disagg_router:Frontend", "configs/disagg_router.yaml"),
]


def deploy(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """`dynamo deploy ARGS` in ``cwd`` (a process of its own: graphs import modules of the same names)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DYNAMO_IMAGE", "DYNAMO_SERVICE_CONFIG")}
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.sdk.cli.main", "deploy", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=RENDER_TIMEOUT,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def render(cwd: Path, *args: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load_all(deploy(cwd, *args).stdout))


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name} among {[(o['kind'], o['metadata']['name']) for o in objects]}"
    return matches[0]


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def env_of(deployment: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(deployment)["env"]}


def validate_all(objects: list[dict[str, Any]]) -> None:
    for version in K8S_VERSIONS:
        for obj in objects:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{obj['kind']}/{obj['metadata']['name']} invalid for {version}: {exc}") from exc


def graph_args(directory: str, graph: str, config: str | None) -> tuple[Path, list[str]]:
    return EXAMPLES_DIR / directory, [graph, *(["-f", config] if config else [])]


@pytest.mark.parametrize(("golden", "directory", "graph", "config"), GRAPHS, ids=[g[0] for g in GRAPHS])
def test_golden_manifests(golden, directory, graph, config):
    cwd, args = graph_args(directory, graph, config)
    text = deploy(cwd, *args).stdout
    path = GOLDEN_DIR / f"{golden}.yaml"
    if os.environ.get("DYN_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden {path}; run with DYN_UPDATE_GOLDEN=1 to write it"
    assert text == path.read_text(), f"{graph} renders differently from {path} (DYN_UPDATE_GOLDEN=1 to accept)"
    # Deterministic: a second render gives the same bytes.
    assert deploy(cwd, *args).stdout == text


@pytest.mark.parametrize("golden", [g[0] for g in GRAPHS])
def test_golden_manifests_are_valid_kubernetes(golden):
    objects = list(yaml.safe_load_all((GOLDEN_DIR / f"{golden}.yaml").read_text()))
    assert objects
    validate_all(objects)


def test_strict_validation_catches_a_wrong_field():
    objects = list(yaml.safe_load_all((GOLDEN_DIR / "llm_agg.yaml").read_text()))
    deployment = find(objects, "Deployment", "agg-worker")
    container(deployment)["readinessProbe"]["httpGets"] = container(deployment)["readinessProbe"].pop("httpGet")
    with pytest.raises(AssertionError, match="agg-worker invalid"):
        validate_all([deployment])


def test_every_flag_renders_valid_objects(tmp_path):
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    deploy(
        cwd, *args, "--namespace", "prod", "--ingress", "llm.example.com", "--ingress-class", "nginx",
        "--image", "registry.example.com/llm:1", "--name", "llm", "--shutdown-timeout", "60", "-o", str(tmp_path),
    )
    objects = list(yaml.safe_load_all((tmp_path / "llm.yaml").read_text()))
    validate_all(objects)
    assert {o["metadata"]["namespace"] for o in objects} == {"prod"}
    ingress = find(objects, "Ingress", "llm-frontend")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["rules"][0]["host"] == "llm.example.com"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["name"] == "llm-frontend"
    worker = find(objects, "Deployment", "llm-worker")
    assert container(worker)["image"] == "registry.example.com/llm:1"
    assert env_of(worker)["DYN_SHUTDOWN_TIMEOUT"] == "60"
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 70
    frontend = find(objects, "Deployment", "llm-frontend")
    assert frontend["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 75


def test_workers_and_plane_settings_and_contract():
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    objects = render(cwd, *args)
    worker, frontend = find(objects, "Deployment", "agg-worker"), find(objects, "Deployment", "agg-frontend")
    assert worker["spec"]["replicas"] == 2  # configs/agg.yaml: Worker.ServiceArgs.workers
    assert worker["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    env = env_of(worker)
    assert env["DYN_DISCOVERY_BACKEND"] == "etcd" and env["ETCD_ENDPOINTS"] == "http://agg-etcd:2379"
    assert env["DYN_REQUEST_PLANE"] == env["DYN_EVENT_PLANE"] == "nats"
    assert env["NATS_SERVER"] == "nats://agg-nats:4222"
    assert env["DYN_SYSTEM_ENABLED"] == "true" and env["DYN_SYSTEM_PORT"] == "9090"
    config_ref = {"configMapKeyRef": {"name": "agg-worker-config", "key": "DYNAMO_SERVICE_CONFIG"}}
    assert env["DYNAMO_SERVICE_CONFIG"] == config_ref
    config_map = find(objects, "ConfigMap", "agg-worker-config")
    assert yaml.safe_load(config_map["data"]["DYNAMO_SERVICE_CONFIG"])["Worker"]["speedup-ratio"] == 10
    assert container(worker)["command"] == ["python", "-m", "components.worker"]  # a BaseDeployment: its module
    # Workers: probes on the system port, no preStop, grace = 0 + 30 + 10.
    assert container(worker)["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "system"}
    assert container(worker)["livenessProbe"]["httpGet"] == {"path": "/live", "port": "system"}
    assert "lifecycle" not in container(worker)
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 40
    # The HTTP frontend: probes on its HTTP port, preStop sleep 5, grace = 5 + 30 + 10.
    assert container(frontend)["command"][:4] == ["python", "-m", "dynamo.sdk.run", "graphs.agg:Frontend"]
    assert container(frontend)["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container(frontend)["lifecycle"] == {"preStop": {"exec": {"command": ["sleep", "5"]}}}
    assert frontend["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 45
    service = find(objects, "Service", "agg-frontend")
    assert service["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
    assert service["spec"]["selector"] == {"dynamo.ai/graph": "agg", "dynamo.ai/service": "Frontend"}
    # A PDB per worker Deployment, none for the frontend.
    assert find(objects, "PodDisruptionBudget", "agg-worker")["spec"]["maxUnavailable"] == 1
    assert find(objects, "PodDisruptionBudget", "agg-processor")["spec"]["maxUnavailable"] == 1
    assert not [o for o in objects if o["kind"] == "PodDisruptionBudget" and o["metadata"]["name"] == "agg-frontend"]
    # Labels a planner selects on.
    labels = worker["spec"]["template"]["metadata"]["labels"]
    assert labels["dynamo.ai/graph"] == "agg" and labels["dynamo.ai/service"] == "Worker"
    assert labels["dynamo.ai/role"] == "worker" and labels["dynamo.ai/namespace"] == "dynamo"
    # The platform: etcd and NATS (JetStream) StatefulSets behind the Services named above.
    assert find(objects, "StatefulSet", "agg-etcd") and find(objects, "Service", "agg-etcd")
    nats = find(objects, "StatefulSet", "agg-nats")
    assert "--jetstream" in container(nats)["args"]
    assert find(objects, "Service", "agg-nats")["spec"]["ports"][0]["port"] == 4222


def test_existing_etcd_and_nats_replace_the_platform():
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    objects = render(cwd, *args, "--etcd", "http://etcd.infra:2379", "--nats", "nats://nats.infra:4222")
    assert not [o for o in objects if o["kind"] == "StatefulSet"]
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "Service"} == {"agg-frontend"}
    env = env_of(find(objects, "Deployment", "agg-processor"))
    assert env["ETCD_ENDPOINTS"] == "http://etcd.infra:2379" and env["NATS_SERVER"] == "nats://nats.infra:4222"


def test_service_and_deployment_classes_resolve_alike_and_overrides_win():
    """@service (Greeter) and BaseDeployment (Worker) feed the same renderer; the file and
    --Service.ServiceArgs overrides set replicas and resources, as for `dynamo serve`."""
    cwd, args = graph_args("standalone", "greeter:Greeter", "config.yaml")
    objects = render(
        cwd, *args,
        "--Greeter.ServiceArgs.workers=3", '--Greeter.ServiceArgs.resources={"cpu": "2", "memory": "4Gi"}',
        "--Worker.ServiceArgs.resources.gpu=2",
    )
    greeter, worker = find(objects, "Deployment", "greeter-greeter"), find(objects, "Deployment", "greeter-worker")
    assert greeter["spec"]["replicas"] == 3
    assert container(greeter)["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"},
    }
    assert worker["spec"]["replicas"] == 2  # config.yaml
    assert container(worker)["resources"] == {"requests": {"cpu": "1"}, "limits": {"cpu": "1", "nvidia.com/gpu": 2}}
    assert container(worker)["command"] == ["python", "-m", "worker"]
    # The Greeter has no HTTP side: no frontend Service, every Deployment a worker with a PDB.
    assert not [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"].startswith("greeter-g")]
    assert find(objects, "PodDisruptionBudget", "greeter-greeter")
    validate_all(objects)


def test_sdk_web_app_frontend_probes_its_runtime():
    """An @api frontend serves HTTP from its runtime process: a Service on its port, the
    probes on the system port (the runtime's /ready)."""
    objects = render(EXAMPLES_DIR / "hello_world", "hello_world:Frontend", "-f", "config.yaml")
    frontend = find(objects, "Deployment", "hello-world-frontend")
    assert container(frontend)["readinessProbe"]["httpGet"]["port"] == "system"
    assert {"name": "http", "containerPort": 8000, "protocol": "TCP"} in container(frontend)["ports"]
    assert find(objects, "Service", "hello-world-frontend")["spec"]["ports"][0]["port"] == 8000
    assert find(objects, "Deployment", "hello-world-backend")["spec"]["replicas"] == 2


def test_shutdown_timeout_from_service_envs_sizes_the_grace_period():
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    objects = render(cwd, *args, "--Worker.ServiceArgs.envs.DYN_SHUTDOWN_TIMEOUT=120")
    worker = find(objects, "Deployment", "agg-worker")
    assert env_of(worker)["DYN_SHUTDOWN_TIMEOUT"] == "120"
    assert worker["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 130


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("--Worker.ServiceArgs.resources.gpu=0.5", "Kubernetes schedules whole GPUs"),
        ("--Worker.ServiceArgs.resources.disk=1", "unknown resource 'disk'"),
        ("--Nobody.port=1", "unknown service"),
    ],
)
def test_bad_input_is_a_clear_error(override, message):
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    proc = deploy(cwd, *args, override, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_registry_needs_an_artifact():
    cwd, args = graph_args("llm", "graphs.agg:Frontend", "configs/agg.yaml")
    proc = deploy(cwd, *args, "--registry", "registry.example.com", check=False)
    assert proc.returncode == 2 and "use --image" in proc.stderr, proc.stderr


def test_ingress_needs_a_frontend():
    proc = deploy(EXAMPLES_DIR / "standalone", "greeter:Greeter", "--ingress", "x.example.com", check=False)
    assert proc.returncode == 2 and "has no HTTP frontend" in proc.stderr, proc.stderr


def test_the_proposals_deployment_class_renders_like_a_service(tmp_path):
    """Proposal 002's `Deployment` (namespace, name, resources in a plain class) and the
    seeds' `@service(resources=…, workers=…)` reach the same renderer; a config file sets
    replicas and resources of either by name."""
    (tmp_path / "decode.py").write_text(
        "from dynamo.deploy import BaseDeployment\n\n\n"
        "class Deployment(BaseDeployment):\n"
        '    namespace = "dynamo"\n'
        '    name = "sgldecode"\n'
        '    resources = {"gpu": 1}\n'
    )
    (tmp_path / "graph.py").write_text(
        "from dynamo.sdk import depends, endpoint, service\n"
        "from decode import Deployment\n\n\n"
        '@service(dynamo={"namespace": "dynamo"}, resources={"gpu": 2, "cpu": "10", "memory": "20Gi"}, workers=1)\n'
        "class ServiceA:\n"
        "    decode = depends(Deployment)\n\n"
        "    @endpoint()\n"
        "    async def generate(self, request: str):\n"
        "        yield request\n"
    )
    (tmp_path / "config.yaml").write_text(
        "sgldecode:\n  ServiceArgs:\n    workers: 3\n    resources:\n      memory: 40Gi\n"
        "ServiceA:\n  ServiceArgs:\n    workers: 2\n"
    )
    objects = render(tmp_path, "graph:ServiceA", "-f", "config.yaml")
    decode, service_a = find(objects, "Deployment", "graph-sgldecode"), find(objects, "Deployment", "graph-service-a")
    assert decode["spec"]["replicas"] == 3 and service_a["spec"]["replicas"] == 2
    assert container(decode)["command"] == ["python", "-m", "decode"]
    assert container(decode)["resources"] == {
        "requests": {"memory": "40Gi"}, "limits": {"memory": "40Gi", "nvidia.com/gpu": 1},
    }
    assert container(service_a)["resources"] == {
        "requests": {"cpu": "10", "memory": "20Gi"}, "limits": {"cpu": "10", "memory": "20Gi", "nvidia.com/gpu": 2},
    }
    assert decode["metadata"]["labels"]["dynamo.ai/service"] == "sgldecode"
    # It declares no `endpoints`: it may register none, so readiness is "it runs" (as
    # `dynamo serve` treats it); a @service is ready once its endpoints are registered.
    assert container(decode)["readinessProbe"]["httpGet"] == {"path": "/live", "port": "system"}
    assert container(service_a)["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "system"}
    validate_all(objects)

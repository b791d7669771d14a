"""The platform a graph needs on a cluster that has none: etcd (discovery) and NATS with
JetStream (request and event planes), each a one-replica StatefulSet with a volume and a
headless Service whose name is the address the services use."""

from __future__ import annotations

from typing import Any

#: Default images (``--etcd-image`` / ``--nats-image`` replace them).
ETCD_IMAGE = "quay.io/coreos/etcd:v3.5.21"
NATS_IMAGE = "nats:2.11-alpine"
ETCD_PORT, NATS_PORT, NATS_MONITOR_PORT = 2379, 4222, 8222
#: Size of each platform volume.
STORAGE = "1Gi"


def etcd(graph: str, image: str, labels: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """etcd's objects and the endpoint the services use (``ETCD_ENDPOINTS``)."""
    name = f"{graph}-etcd"
    endpoint = f"http://{name}:{ETCD_PORT}"
    container = {
        "name": "etcd",
        "image": image,
        "command": [
            "etcd",
            "--name=etcd",
            "--data-dir=/var/lib/etcd",
            f"--listen-client-urls=http://0.0.0.0:{ETCD_PORT}",
            f"--advertise-client-urls={endpoint}",
        ],
        "ports": [{"name": "client", "containerPort": ETCD_PORT, "protocol": "TCP"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "client"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "client"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}],
    }
    return _stateful(name, labels, container, [{"name": "client", "port": ETCD_PORT}]), endpoint


def nats(graph: str, image: str, labels: dict[str, str]) -> tuple[list[dict[str, Any]], str]:
    """NATS's objects (JetStream on) and the address the services use (``NATS_SERVER``)."""
    name = f"{graph}-nats"
    container = {
        "name": "nats",
        "image": image,
        "args": ["--jetstream", "--store_dir=/data", f"--http_port={NATS_MONITOR_PORT}"],
        "ports": [
            {"name": "client", "containerPort": NATS_PORT, "protocol": "TCP"},
            {"name": "monitor", "containerPort": NATS_MONITOR_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {"httpGet": {"path": "/healthz", "port": "monitor"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "monitor"}, "periodSeconds": 10},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return _stateful(name, labels, container, [{"name": "client", "port": NATS_PORT}]), f"nats://{name}:{NATS_PORT}"


def _stateful(
    name: str, labels: dict[str, str], container: dict[str, Any], ports: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    labels = {**labels, "app.kubernetes.io/name": name}
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": labels["app.kubernetes.io/part-of"]}
    stateful_set = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "serviceName": name,
            "replicas": 1,
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
            "volumeClaimTemplates": [
                {
                    "metadata": {"name": "data"},
                    "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": STORAGE}}},
                }
            ],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            "ports": [{**p, "targetPort": p["name"], "protocol": "TCP"} for p in ports],
        },
    }
    return [stateful_set, service]

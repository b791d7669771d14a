"""The probe, preStop and grace-period contract between the manifests and the processes
(docs/deploy.md, "Readiness and drain"): workers answer ``/live`` and ``/ready`` on their
system port, the HTTP frontend on its HTTP port; SIGTERM drains within
``DYN_SHUTDOWN_TIMEOUT``; a frontend sleeps in preStop so that Service endpoints drop it
before it stops accepting."""

from __future__ import annotations

from typing import Any

# ``DYN_SHUTDOWN_TIMEOUT`` when nothing sets it, and the slack between that drain bound
# and SIGKILL: the same on a cluster as under ``dynamo serve`` and the planner.
from dynamo.supervisor import DEFAULT_SHUTDOWN_TIMEOUT as DEFAULT_SHUTDOWN_TIMEOUT
from dynamo.supervisor import KILL_MARGIN_SECONDS as GRACE_MARGIN_SECONDS

#: The system server's port in every container (``DYN_SYSTEM_PORT``).
SYSTEM_PORT = 9090
#: The frontend's preStop sleep (seconds).
FRONTEND_PRESTOP_SECONDS = 5

LIVE_PATH, READY_PATH = "/live", "/ready"


def grace_period(prestop_seconds: int, shutdown_timeout: int) -> int:
    """``terminationGracePeriodSeconds``: preStop + drain bound + margin."""
    return prestop_seconds + shutdown_timeout + GRACE_MARGIN_SECONDS


def probes(port_name: str, ready_path: str = READY_PATH) -> dict[str, Any]:
    """The container's readiness (``ready_path``: ``/ready``) and liveness (``/live``)
    probes on ``port_name``. A process whose readiness cannot be known (a
    ``BaseDeployment`` that declares no ``endpoints``: it may register none, and then its
    ``/ready`` never turns 200) is probed for readiness on ``/live``, as ``dynamo serve``
    treats it as started once it runs."""
    return {
        "readinessProbe": {
            "httpGet": {"path": ready_path, "port": port_name},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        "livenessProbe": {
            "httpGet": {"path": LIVE_PATH, "port": port_name},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
    }


def prestop_sleep(seconds: int) -> dict[str, Any]:
    """The container's ``lifecycle`` with a preStop that sleeps ``seconds``."""
    return {"preStop": {"exec": {"command": ["sleep", str(seconds)]}}}

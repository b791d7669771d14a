"""A Kubernetes API server for tests, answering with recorded responses: a loopback HTTP
server that hands each request to the test's `answer` function, and a kubeconfig that
points the official client at it (tests/test_deploy_apply.py, tests/test_planner_kubernetes.py).
The bodies in tests/data/k8s are hand-recorded in the Kubernetes API's shapes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

DATA = Path(__file__).parent / "data" / "k8s"
#: The bearer token of the kubeconfig's user.
TOKEN = "recorded-token"
NOT_FOUND = (404, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound"})


def recorded(name: str) -> dict[str, Any]:
    """A recorded body from tests/data/k8s."""
    return json.loads((DATA / name).read_text())


@dataclass
class Request:
    """One request the client made (headers lower-cased; the body parsed: JSON is YAML)."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@contextmanager
def serve_recorded(answer: Callable[[Request], tuple[int, dict[str, Any]]]) -> Iterator[str]:
    """Serve GET and PATCH on a free loopback port with `answer`'s (status, body); yields
    the server's URL. Stopped (bounded) on exit."""

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            url = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            request = Request(
                method=self.command, path=url.path, query=dict(parse_qsl(url.query)),
                headers={k.lower(): v for k, v in self.headers.items()},
                body=yaml.safe_load(raw) if raw else None,
            )
            status, body = answer(request)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def write_kubeconfig(path: Path, server: str, namespace: str = "team") -> Path:
    """A kubeconfig whose current context talks to `server` as user `ci` (bearer `TOKEN`)
    in `namespace`."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "recorded", "cluster": {"server": server}}],
        "users": [{"name": "ci", "user": {"token": TOKEN}}],
        "contexts": [{"name": "recorded", "context": {"cluster": "recorded", "user": "ci", "namespace": namespace}}],
        "current-context": "recorded",
    }))
    return path

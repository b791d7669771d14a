"""The processes of one pod as the rendered manifests run them (the plane settings and
`DYN_SYSTEM_ENABLED=true`, `DYN_SYSTEM_PORT` for every container): the LLM graphs'
Frontend, a service whose runtime serves the system port and whose child is the HTTP
frontend, must not have the two bind the same port (the child exited at once)."""

from __future__ import annotations

import sys
import urllib.request

import pytest
from helpers import EXAMPLES_DIR, READY_TIMEOUT, free_port, wait_until


def http_status(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


@pytest.mark.timeout(120)
async def test_llm_frontend_pod_with_the_system_server_enabled(backend, workers):
    system_port, http_port = free_port(), free_port()
    env = {**workers.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_PORT": str(system_port)}
    frontend = workers.command(
        [sys.executable, "-m", "dynamo.sdk.run", "graphs.agg:Frontend", "--service-name", "Frontend",
         f"--port={http_port}"],
        name="frontend", cwd=EXAMPLES_DIR / "llm", env=env,
    )
    await frontend.wait_for_line("Frontend ready", READY_TIMEOUT)
    # The HTTP frontend listens (it lists no model: no Processor runs), the service's
    # runtime answers on the system port, and both processes keep running.
    def listening() -> bool:
        if frontend.proc.poll() is not None:
            pytest.fail(f"the Frontend exited\n{frontend.describe()}")
        return http_status(f"http://127.0.0.1:{http_port}/v1/models") == 200

    await wait_until(listening, READY_TIMEOUT, lambda: f"the HTTP frontend on {http_port}\n{frontend.describe()}",
                     ignore=(OSError,))
    assert http_status(f"http://127.0.0.1:{system_port}/live") == 200
    assert frontend.proc.poll() is None, frontend.describe()
    assert "exited with status" not in frontend.stderr_tail(), frontend.describe()

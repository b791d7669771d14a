"""The low-level runtime example (examples/runtime), run as the README says, on both backends."""

from __future__ import annotations

import subprocess
import sys

from helpers import EXAMPLES_DIR, REPO_ROOT

HELLO = EXAMPLES_DIR / "runtime"
#: Bound on the whole example (worker start, client, graceful stop).
EXAMPLE_TIMEOUT = 60


def run_example(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT,
    )


def test_hello_world_main(backend, namespace):
    done = run_example([str(HELLO / "main.py")], backend.with_(HELLO_WORLD_NAMESPACE=namespace))
    output = f"exit {done.returncode}\n--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr[-4000:]}"
    assert done.returncode == 0, output
    words = ["hello", "world", "from", "dynamo"]
    # The worker shares the example's stdout; the client prints one word a line.
    assert [line for line in done.stdout.splitlines() if line in words] == words, output
    assert "hello world: OK" in done.stdout, output


async def test_hello_world_worker_and_client(backend, workers, namespace):
    env = backend.with_(HELLO_WORLD_NAMESPACE=namespace)
    worker = workers.spawn(HELLO / "worker.py", env=env)
    await worker.wait_for_line("worker ", 30)
    done = run_example([str(HELLO / "client.py"), "streams of words"], env)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr[-4000:]}"
    assert done.stdout.split() == ["streams", "of", "words"], done.stdout
    worker.terminate()
    assert worker.proc.returncode == 0, worker.describe()

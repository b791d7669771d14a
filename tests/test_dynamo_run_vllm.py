"""``dynamo-run out=vllm``: the engine as a child process (``python -m dynamo.vllm``) on a
private endpoint, this process the frontend bound to it.

vLLM itself needs a GPU; the child's module is chosen by ``DYN_VLLM_MODULE``, so here the
mocker (``python -m dynamo.mocker``, which takes the same flags) runs behind the same
interface: spawning, the flags it gets, serving through it, its death ending the run, and
the run's end stopping it.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from helpers import WorkerPool
from llm_helpers import chat_body, launch_frontend, write_json, write_model_dir

START_TIMEOUT = 60.0


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (all its threads)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(c) for c in text]
    return found


def mocker_env(pool: WorkerPool) -> dict[str, str]:
    return {**pool.env, "DYN_VLLM_MODULE": "dynamo.mocker"}


async def start(pool: WorkerPool, tmp_path: Path, *extra: str) -> Any:
    model = write_model_dir(tmp_path)
    engine_args = write_json(tmp_path / "engine.json", {"speedup_ratio": 100.0})
    frontend = launch_frontend(
        pool, "vllm", "--model-path", str(model), "--model-name", "m",
        "--extra-engine-args", str(engine_args), *extra, env=mocker_env(pool),
    )
    await frontend.wait_live(START_TIMEOUT)
    await frontend.wait_models(["m"], START_TIMEOUT)
    return frontend


async def test_out_vllm_serves_the_engine_child_and_stops_it(workers: WorkerPool, tmp_path: Path) -> None:
    frontend = await start(workers, tmp_path, "--", "--num-gpu-blocks", "512")
    response = await asyncio.to_thread(frontend.post, "/v1/chat/completions", chat_body("m", "w3 w4 w5", max_tokens=6))
    assert response.status == 200, response.body
    assert response.json()["usage"]["completion_tokens"] == 6
    engine = children(frontend.process.pid)
    assert len(engine) == 1, engine
    argv = Path(f"/proc/{engine[0]}/cmdline").read_text().split("\0")
    # --extra-engine-args became flags, then the flags after -- as given
    assert argv[argv.index("--speedup-ratio") + 1] == "100.0"
    assert argv[argv.index("--num-gpu-blocks") + 1] == "512"
    assert argv[argv.index("--model-name") + 1] == "m"

    frontend.process.send_signal(signal.SIGTERM)
    assert await frontend.process.wait_exit(40) == 0
    assert not Path(f"/proc/{engine[0]}").exists() or "zombie" in Path(f"/proc/{engine[0]}/status").read_text()


async def test_the_engine_child_dying_ends_the_run_with_an_error(workers: WorkerPool, tmp_path: Path) -> None:
    frontend = await start(workers, tmp_path)
    (engine,) = children(frontend.process.pid)
    os.kill(engine, signal.SIGKILL)
    assert await frontend.process.wait_exit(40) == 1
    assert "the engine process (python -m dynamo.mocker) exited" in frontend.process.stderr_tail()


async def test_without_vllm_the_run_says_how_to_install_it(workers: WorkerPool, tmp_path: Path) -> None:
    model = write_model_dir(tmp_path)
    # Where vLLM is installed, a package of the same name first on the path hides it.
    hidden = tmp_path / "no-vllm" / "vllm"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError(\"No module named 'vllm'\")\n")
    path = os.pathsep.join(p for p in (str(hidden.parent), os.environ.get("PYTHONPATH")) if p)
    frontend = launch_frontend(workers, "vllm", "--model-path", str(model), env={**workers.env, "PYTHONPATH": path})
    assert await frontend.process.wait_exit(START_TIMEOUT) == 1
    stderr = frontend.process.stderr_tail()
    assert "needs the vllm package" in stderr
    assert "the engine process (python -m dynamo.vllm) exited: exit status: 2" in stderr

"""The worker base every engine shares (``dynamo.engine``), engine-independently: a
pure-Python engine adapter (tests/workers/toy_engine_worker.py) served by the base in a
real process behind the frontend — registration, the handler's stream-end rules (a
rejected request, a stream that ends unfinished, a caller that stops, a dead engine),
the KV-event bridge from an in-process event stream, load reports, and drain on shutdown
— plus ``dynamo-run out=vllm`` running it as its engine module."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import WORKERS_DIR, WorkerPool, WorkerProcess, wait_until
from llm_helpers import launch_frontend, start_frontend, wait_for_metrics_from

pytestmark = pytest.mark.timeout(120)

WORKER = WORKERS_DIR / "toy_engine_worker.py"
BLOCK = 4


def start_toy(pool: WorkerPool, namespace: str, model_dir: Path, *args: str) -> WorkerProcess:
    return pool.command(
        [sys.executable, str(WORKER), "--model-path", str(model_dir), "--endpoint", f"{namespace}.toy.generate",
         "--kv-cache-block-size", str(BLOCK), *args],
        name="toy",
    )


def completion(frontend: Any, model: str, prompt: str, **extra: Any) -> Any:
    return frontend.post("/v1/completions", {"model": model, "prompt": prompt, **extra})


async def serving(pool: WorkerPool, namespace: str, model_dir: Path, *args: str) -> tuple[WorkerProcess, Any]:
    worker = start_toy(pool, namespace, model_dir, *args)
    frontend = await start_frontend(pool, "dyn")
    await frontend.wait_models([model_dir.name])
    # The base's readiness check (dynamo.engine.serve): a one-token request of its own
    # before the worker says ready; the tests' requests come after it has ended.
    await wait_until(lambda: worker.find_lines("ENDED "), 30, lambda: f"the readiness check\n{worker.describe()}")
    return worker, frontend


async def test_the_base_serves_an_engine_and_keeps_serving_after_errors(
    workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    worker, frontend = await serving(workers, namespace, model_dir)
    model = model_dir.name

    ok = await asyncio.to_thread(completion, frontend, model, "w3 w4 w5", max_tokens=3, temperature=0.5)
    assert ok.status == 200, ok.body
    answer = ok.json()
    assert answer["choices"][0]["text"].split() == ["w3", "w4", "w5"]
    assert answer["choices"][0]["finish_reason"] == "length"
    [line] = await worker_lines(worker, "REQUEST", 1)
    assert json.loads(line.split(" ", 2)[2])["temperature"] == 0.5  # the request reached the adapter

    rejected = await asyncio.to_thread(completion, frontend, model, "w900 w4", max_tokens=3)
    assert rejected.status >= 400 and b"the toy engine refuses prompts with w900" in rejected.body, rejected
    unfinished = await asyncio.to_thread(completion, frontend, model, "w902 w4", max_tokens=3)
    assert unfinished.status >= 400, unfinished
    assert b"Toy ended the stream without finishing the request" in unfinished.body, unfinished

    again = await asyncio.to_thread(completion, frontend, model, "w3 w4", max_tokens=2)
    assert again.status == 200 and again.json()["choices"][0]["text"].split() == ["w3", "w4"], again.body


async def worker_lines(worker: WorkerProcess, prefix: str, count: int, timeout: float = 10.0) -> list[str]:
    """The worker's `prefix` lines of the tests' requests (the readiness check's left out)."""
    found: list[str] = []

    def enough() -> list[str] | None:
        nonlocal found
        check = [line.split()[1] for line in worker.find_lines("REQUEST ")[:1]]
        found = [line for line in worker.find_lines(prefix + " ") if line.split()[1] not in check]
        return found if len(found) >= count else None

    return await wait_until(enough, timeout, lambda: f"{count} {prefix} lines (have {len(found)}): {worker.describe()}")


async def test_a_stopped_stream_aborts_the_engine_request(workers: WorkerPool, namespace: str, model_dir: Path) -> None:
    worker, frontend = await serving(workers, namespace, model_dir)
    # The frontend's stop string ends the stream at w6: the engine's request stops there
    # (aborted by the base when it sees the stop, or closed when the caller's stream goes)
    # instead of running on to 60 tokens.
    answer = await asyncio.to_thread(completion, frontend, model_dir.name, "w903 w4", max_tokens=60, stop=["w6"])
    assert answer.status == 200, answer.body
    assert answer.json()["choices"][0]["finish_reason"] == "stop"
    [request] = await worker_lines(worker, "REQUEST", 1)
    [ended] = await worker_lines(worker, "ENDED", 1)
    assert ended.split()[1] == request.split()[1]
    assert int(ended.split()[2]) < 10, worker.describe()
    for aborted in worker.find_lines("ABORTED "):
        assert aborted.split()[1] == request.split()[1]


async def test_a_dead_engine_errors_the_stream_and_shuts_the_worker_down(
    workers: WorkerPool, namespace: str, model_dir: Path
) -> None:
    worker, frontend = await serving(workers, namespace, model_dir)
    dead = await asyncio.to_thread(completion, frontend, model_dir.name, "w901 w4", max_tokens=5)
    assert dead.status >= 400 and b"the Toy engine died" in dead.body, dead
    # runtime.shutdown(): the worker drains, stops its engine and exits; its model leaves.
    assert await worker.wait_exit(30) == 0, worker.describe()
    assert worker.find_lines("ENGINE STOPPED") == ["ENGINE STOPPED"]
    await frontend.wait_models([], timeout=30)


async def test_engine_kv_events_and_load_reach_the_event_plane(
    workers: WorkerPool, runtime: Any, namespace: str, model_dir: Path
) -> None:
    from dynamo.llm import KvIndexer
    from helpers import wait_for_instances

    component = runtime.namespace(namespace).component("toy")
    indexer = KvIndexer(component, BLOCK)
    metrics = await component.subscribe("load_metrics")
    worker, frontend = await serving(workers, namespace, model_dir)
    [instance] = await wait_for_instances(await runtime.endpoint(f"{namespace}.toy.generate").client(), 1)
    await wait_for_metrics_from(metrics, {instance})

    prompt = " ".join(f"w{i}" for i in range(10, 19))  # 9 tokens: 2 full blocks
    answer = await asyncio.to_thread(completion, frontend, model_dir.name, prompt, max_tokens=1)
    assert answer.status == 200, answer.body
    tokens = list(range(10, 19))
    scores: dict[int, int] = {}

    async def indexed() -> bool:
        nonlocal scores
        scores = (await indexer.find_matches_for_request(tokens)).scores
        return scores == {instance: 2}

    await wait_until(
        indexed, 10, lambda: f"the prompt's 2 blocks in the index (it shows {scores})\n{worker.describe()}",
        interval=0.1,
    )


async def test_dynamo_run_runs_a_base_worker_as_its_engine(workers: WorkerPool, model_dir: Path) -> None:
    """`dynamo-run in=http out=vllm` with DYN_VLLM_MODULE naming a module built on the base:
    the flags dynamo-run passes (--endpoint, --model-path, --model-name, ...) are the base's."""
    env = {**workers.env, "DYN_VLLM_MODULE": "toy_engine_worker",
           "PYTHONPATH": os.pathsep.join([str(WORKERS_DIR), workers.env.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    frontend = launch_frontend(workers, "vllm", "--model-path", str(model_dir), "--model-name", "toy",
                               "--kv-cache-block-size", str(BLOCK), env=env)
    await frontend.wait_live(60)
    await frontend.wait_models(["toy"], 60)
    answer = await asyncio.to_thread(completion, frontend, "toy", "w3 w4", max_tokens=2)
    assert answer.status == 200 and answer.json()["choices"][0]["text"].split() == ["w3", "w4"], answer.body


@pytest.mark.parametrize(("engine", "package"), [("sglang", "sglang"), ("trtllm", "tensorrt_llm")])
def test_a_graph_worker_picks_the_engine_and_says_what_is_missing(
    engine: str, package: str, tmp_path: Path
) -> None:
    """examples/llm's Worker with `engine: sglang | trtllm` runs `python -m dynamo.<engine>`,
    which exits 2 naming the package when the engine does not import."""
    import os
    import subprocess

    from helpers import EXAMPLES_DIR

    # Where the package is installed, one of the same name first on the path hides it.
    hidden = tmp_path / package
    hidden.mkdir()
    (hidden / "__init__.py").write_text(f"raise ImportError(\"No module named '{package}'\")\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    for component in ("components.worker", "components.prefill_worker"):
        done = subprocess.run([sys.executable, "-m", component, "--engine", engine], cwd=EXAMPLES_DIR / "llm",
                              capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 2 and f"needs the {package} package" in done.stderr, done.stderr

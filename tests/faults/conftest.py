"""Fixtures of the fault suite (`pytest -m faults`): a fleet per test on either backend,
and the reliability table the tests fill (printed at the end of the session and, when
`DYN_FAULT_REPORT` names a file, written there as JSON for docs/reliability.md)."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import Fleet
from llm_helpers import write_model_dir
from load import Report

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


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _REPORTS:
        return
    terminalreporter.section("reliability (fault suite)")
    terminalreporter.write_line(
        "| fault | backend | sent | ok | failed | truncated | hung | error time p50 / max (s) | recovery (s) | why |"
    )
    terminalreporter.write_line("|---|---|---|---|---|---|---|---|---|---|")

    def s(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    for r in _REPORTS:
        terminalreporter.write_line(
            f"| {r.fault} | {r.backend} | {r.sent} | {r.ok} | {r.failed} | {r.truncated} | {r.hung} | "
            f"{s(r.error_p50)} / {s(r.error_max)} | {s(r.recovery)} | {'; '.join(r.reasons)[:200]} |"
        )
    target = os.environ.get("DYN_FAULT_REPORT")
    if target:
        Path(target).write_text(json.dumps([r.as_dict() for r in _REPORTS], indent=2))

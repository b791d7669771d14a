"""The soak run of docs/reliability.md: 32 streaming clients for `DYN_SOAK_SECONDS`
through the frontend to 3 mocker workers, no fault injected. It asserts only that no
request failed; the resident memory of every process at the start and the end is
printed (and written to `DYN_SOAK_REPORT` as JSON when set) for the document — memory is
measured, not asserted.

    DYN_SOAK_SECONDS=600 python -m pytest tests/faults/test_fault_soak.py -s
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest
from fleet import Fleet
from load import Load

SOAK_SECONDS = float(os.environ.get("DYN_SOAK_SECONDS", "0"))

pytestmark = [
    pytest.mark.skipif(not SOAK_SECONDS, reason="a long run: set DYN_SOAK_SECONDS (e.g. 600) to soak"),
    pytest.mark.timeout(int(SOAK_SECONDS) + 180),
]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def test_soak(fleet: Fleet) -> None:
    await fleet.start_workers(3)
    frontend = await fleet.start_frontend()
    processes = [frontend.process, *fleet.workers]
    load = Load(frontend.port, fleet.model, clients=32)
    load.start()
    await asyncio.sleep(10)
    start = {p.name: rss_mib(p.pid) for p in processes}
    await asyncio.sleep(SOAK_SECONDS)
    end = {p.name: rss_mib(p.pid) for p in processes}
    await load.stop()
    kinds = {k: sum(o.kind == k for o in load.outcomes) for k in ("ok", "error", "truncated", "hung")}
    report = {"backend": fleet.backend, "seconds": SOAK_SECONDS, "requests": kinds,
              "rss_mib": {name: [round(start[name], 1), round(end[name], 1)] for name in start}}
    print(json.dumps(report, indent=2))
    if os.environ.get("DYN_SOAK_REPORT"):
        Path(os.environ["DYN_SOAK_REPORT"]).write_text(json.dumps(report, indent=2))
    assert kinds["ok"] == len(load.outcomes), report

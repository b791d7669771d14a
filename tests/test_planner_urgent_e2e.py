"""The planner's urgent check in real processes (embedded backend): an HTTP frontend, the
planner with its local connector and a profile, and the mocker workers it starts. Under
an open-loop load that steps from 1 to 12 req/s, the queue builds in the one worker's
load reports, and the urgent check asks for more replicas between two load passes 30 s
apart: the first scale-up is the urgent check's, and the replicas it asked for start.
With ``urgent_s: null`` the first scale-up would be the load loop's, 30 s after the
window before the step."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from faults.load import OpenLoad
from helpers import wait_until
from llm_helpers import MOCKER, Planner, launch_frontend, write_json

pytestmark = [pytest.mark.parametrize("backend", ["embedded"], indirect=True), pytest.mark.timeout(180)]

#: Two sequences at a time, 20 ms decode steps: a 24-token request holds a slot ~0.5 s,
#: so one worker serves about 4 req/s and a queue builds at 12.
MOCKER_SETTINGS = {"max_num_seqs": 2, "decode_base_ms": 20.0}
#: The load loop's interval: long, so a scale-up between two passes is the urgent check's.
LOAD_S = 30.0
BASE_RATE, STEP_RATE = 1.0, 12.0
#: Seconds of the base load the window before the step holds at least.
BASE_WINDOW_S = 5.0
#: Bound on a worker starting and registering, and on the planner's first window.
START_BOUND = 60.0


def profile() -> dict[str, Any]:
    """One replica of the settings above, written out rather than swept (the sweep takes a
    minute): about 4 req/s within a 500 ms TTFT, whatever the prompt's length."""
    points = [
        (1, 30.0, 21.0, 2.0), (2, 40.0, 22.0, 4.0), (4, 600.0, 22.0, 4.0), (8, 1500.0, 22.0, 4.0),
    ]
    return {
        "engine": "mocker", "osl": 24,
        "points": [
            {"isl": 64, "concurrency": c, "ttft_ms": ttft, "itl_ms": itl, "throughput_rps": rps}
            for c, ttft, itl, rps in points
        ],
    }


def planner_config(path: Path, model_dir: Path, frontend_port: int, endpoint: str, tmp_path: Path) -> Path:
    settings = write_json(tmp_path / "mocker.json", MOCKER_SETTINGS)
    command = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint, "--extra-engine-args", str(settings)]
    config = {
        "model": model_dir.name,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": 500}, "itl": {"quantile": 0.9, "ms": 200}},
        "roles": {"agg": {"min_replicas": 1, "max_replicas": 4, "endpoint": endpoint, "command": command}},
        # The throughput loop's first pass (at start, with no window) holds; its next is
        # after the test.
        "intervals": {"load_s": LOAD_S, "throughput_s": 600, "urgent_s": 1},
        "profile": str(write_json(tmp_path / "profile.json", profile())),
        "stale_after_s": 5,
        "connector": {"kind": "local", "stop_timeout_s": 20},
    }
    path.write_text(json.dumps(config))
    return path


async def test_a_load_step_is_answered_by_the_urgent_check_before_the_next_load_pass(
    backend: Any, workers: Any, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    endpoint = f"{namespace}.mocker.generate"
    frontend = launch_frontend(workers, "dyn", "--http-host", "127.0.0.1")
    port = frontend.port
    # The frontend first: the planner's first scrape (at its start) must find it, so that
    # its second load pass has a window.
    await frontend.wait_live()
    planner = Planner(workers, planner_config(tmp_path / "planner.yaml", model_dir, port, endpoint, tmp_path))
    fleet, describe = planner.fleet, planner.describe
    await frontend.wait_models([model_dir.name], timeout=START_BOUND)
    await wait_until(lambda: fleet().get("ready") == 1, START_BOUND, describe, ignore=(OSError,))

    load = OpenLoad(port, model_dir.name, rate=BASE_RATE)
    load.start()
    base_from = time.time()  # the decisions' clock
    try:
        # A load pass whose window holds some of the base load: the urgent check takes
        # that window's rate and prompt length as the demand before the step.
        def windowed() -> bool:
            decisions = planner.health()["decisions"]
            return any(d["loop"] == "load" and d["at"] >= base_from + BASE_WINDOW_S for d in decisions)

        await wait_until(windowed, LOAD_S + BASE_WINDOW_S + START_BOUND, describe, interval=0.2, ignore=(OSError,))
        load.rate = STEP_RATE
        stepped_at = time.time()  # the decisions' clock

        def first_up() -> dict[str, Any] | None:
            decisions = planner.health()["decisions"]
            ups = [d for d in decisions if d["action"] == "up" and d["at"] >= stepped_at]
            return ups[0] if ups else None

        # Bounded past the next load pass, so that without the urgent check the load
        # loop's scale-up is what this finds (and the assertion below fails).
        up = await wait_until(first_up, LOAD_S + 20, describe, interval=0.2, ignore=(OSError,))
        assert up["loop"] == "urgent", f"the first scale-up came from the {up['loop']} loop: {up}\n{describe()}"
        assert up["done"], up
        assert "waiting on 1 ready replica" in up["reason"], up
        await wait_until(lambda: fleet().get("ready", 0) >= up["target"], START_BOUND, describe, interval=0.2,
                         ignore=(OSError,))
    finally:
        await load.stop()

    bad = [o for o in load.outcomes if o.kind != "ok"]
    assert not bad, f"{len(bad)} of {len(load.outcomes)} requests failed: {[o.detail for o in bad[:5]]}"
    await planner.stop()

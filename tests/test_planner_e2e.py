"""The planner in real processes (both backends): an HTTP frontend, the planner with
its local connector, and the mocker workers it starts. A load step makes the fleet grow;
a lighter load lets it shrink back to one replica while requests still flow (each
removal drains), and the planner's SIGTERM drains the rest. No request may fail. Behind a
frontend that holds requests while every worker is busy (`--busy-wait-s`), the same
step is held at the frontend, not in the engines, and the fleet grows for it without a
request refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from faults.load import Load
from helpers import wait_until
from llm_helpers import MOCKER, Frontend, Planner, launch_frontend, write_json

#: Two sequences at a time and 20 ms steps: a 24-token request holds a slot ~0.5 s, so
#: eight clients queue on one worker (TTFT well over 500 ms) and not on four.
MOCKER_SETTINGS = {"max_num_seqs": 2, "decode_base_ms": 20.0}
#: The same engine with 16 KV blocks of 16 tokens: the load's requests take 4 to 5 blocks
#: each, so two running put a worker over a busy threshold of 0.5.
BUSY_MOCKER_SETTINGS = {**MOCKER_SETTINGS, "num_gpu_blocks": 16}
SCALE_BOUND = 60.0


def planner_yaml(path: Path, model: str, frontend_port: int, endpoint: str, settings: Path, model_dir: Path) -> Path:
    command = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint, "--extra-engine-args", str(settings)]
    config = {
        "model": model,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": 500}, "itl": {"quantile": 0.9, "ms": 200}},
        "roles": {"agg": {"min_replicas": 1, "max_replicas": 4, "endpoint": endpoint, "command": command}},
        "intervals": {"load_s": 1.5, "throughput_s": 30},
        "stale_after_s": 5,
        "connector": {"kind": "local", "stop_timeout_s": 20},
    }
    path.write_text(json.dumps(config))
    return path


async def one_planned_worker(
    workers: Any, namespace: str, model_dir: Path, tmp_path: Path, mocker: dict[str, Any], *frontend_args: str
) -> tuple[Frontend, Planner]:
    """A frontend (with `frontend_args`) and the planner, once the planner has started its
    minimum of one mocker worker (with `mocker` settings) by itself."""
    endpoint = f"{namespace}.mocker.generate"
    settings = write_json(tmp_path / "mocker.json", mocker)
    frontend = launch_frontend(workers, "dyn", "--http-host", "127.0.0.1", *frontend_args)
    config = planner_yaml(tmp_path / "planner.yaml", model_dir.name, frontend.port, endpoint, settings, model_dir)
    planner = Planner(workers, config)
    await frontend.wait_live()
    await frontend.wait_models([model_dir.name], timeout=SCALE_BOUND)
    await wait_until(lambda: planner.fleet().get("ready") == 1, SCALE_BOUND, planner.describe, ignore=(OSError,))
    return frontend, planner


@pytest.mark.timeout(150)
async def test_scales_up_under_a_load_step_and_back_down_losing_nothing(
    backend: Any, workers: Any, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    frontend, planner = await one_planned_worker(workers, namespace, model_dir, tmp_path, MOCKER_SETTINGS)
    port = frontend.port
    fleet, describe = planner.fleet, planner.describe

    heavy = Load(port, model_dir.name, clients=8)
    heavy.start()
    await wait_until(lambda: fleet().get("ready", 0) >= 3, SCALE_BOUND, describe, interval=0.2, ignore=(OSError,))
    light = Load(port, model_dir.name, clients=2)
    light.start()
    await heavy.stop()
    # Under the light load the fleet shrinks, one drained worker at a time, to the minimum.
    await wait_until(lambda: fleet() == {"ready": 1, "pending": 0}, SCALE_BOUND, describe, interval=0.2,
                     ignore=(OSError,))
    await light.stop()

    outcomes = heavy.outcomes + light.outcomes
    bad = [o for o in outcomes if o.kind != "ok"]
    assert not bad, f"{len(bad)} of {len(outcomes)} requests failed: {[o.detail for o in bad[:5]]}"
    assert len(light.outcomes) > 0
    decisions = planner.health()["decisions"]
    downs = [d for d in decisions if d["action"] == "down" and d["done"]]
    assert downs, decisions
    # /metrics counts them, and shows the fleet it ended with.
    metrics = planner.metrics()
    down = ("dynamo_planner_decisions_total", (("action", "down"), ("loop", "load"), ("role", "agg")))
    assert metrics[down] >= len(downs)
    assert metrics[("dynamo_planner_replicas", (("role", "agg"), ("state", "ready")))] == 1.0
    assert metrics[("dynamo_planner_signal_state", (("signal", "frontend_metrics"), ("state", "ok")))] == 1.0
    # The workers report their KV caches through the event plane; a drained worker's last
    # report counts until it is `stale_after_s` old, then only the one left does.
    assert metrics[("dynamo_planner_worker_kv_blocks", (("role", "agg"), ("state", "total")))] > 0
    reporting = ("dynamo_planner_workers_reporting", (("role", "agg"),))
    await wait_until(lambda: planner.metrics()[reporting] == 1.0, 15, describe, ignore=(OSError,))

    # SIGTERM: the planner drains its workers and exits 0.
    await planner.stop()
    await frontend.wait_status("/health", 503, timeout=30)


@pytest.mark.timeout(150)
async def test_a_step_held_at_a_busy_frontend_grows_the_fleet_and_no_request_is_refused(
    backend: Any, workers: Any, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    frontend, planner = await one_planned_worker(
        workers, namespace, model_dir, tmp_path, BUSY_MOCKER_SETTINGS,
        "--router-mode", "kv", "--busy-threshold", "0.5", "--busy-wait-s", "20",
    )
    fleet, describe = planner.fleet, planner.describe

    heavy = Load(frontend.port, model_dir.name, clients=8)
    heavy.start()
    # One worker takes about two requests before it is busy: others wait at the frontend.
    await wait_until(
        lambda: frontend.held_busy(model_dir.name) >= 2, 15, "requests held at the busy frontend", interval=0.1,
        ignore=(OSError,),
    )
    await wait_until(lambda: fleet().get("ready", 0) >= 3, SCALE_BOUND, describe, interval=0.2, ignore=(OSError,))
    # Requests keep flowing on the grown fleet, the held ones among them.
    grown = len(heavy.outcomes)
    await wait_until(lambda: len(heavy.outcomes) >= grown + 16, 30, "requests served on the grown fleet")
    await heavy.stop()

    bad = [o for o in heavy.outcomes if o.kind != "ok"]
    assert not bad, f"{len(bad)} of {len(heavy.outcomes)} requests failed: {[o.detail for o in bad[:5]]}"
    assert frontend.held_busy(model_dir.name) == 0
    await planner.stop()

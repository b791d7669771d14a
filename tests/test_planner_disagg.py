"""The planner sizing a disaggregated fleet in real processes (embedded backend; the
planner over etcd + NATS runs in `test_planner_e2e.py`, and this test passed on etcd +
NATS too when written, at 40 s of CI time a run): an HTTP frontend, and the prefill and
decode mocker workers the planner starts with its local connector (roles `prefill` and
`decode`). Every prompt is prefilled remotely on a slow prefill pool, so a load step
pushes TTFT over its target: the planner grows the prefill role (the one that answers
for TTFT) and leaves decode alone (ITL stays inside its target); a lighter load lets
prefill shrink back to its minimum, each removal drained. No request may fail."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from faults.load import Load
from helpers import wait_until
from llm_helpers import MOCKER, Planner, launch_frontend, write_json

pytestmark = [pytest.mark.parametrize("backend", ["embedded"], indirect=True), pytest.mark.timeout(180)]

#: One prompt at a time at 5 ms per token: a ~45-token prompt holds a prefill worker
#: ~0.25 s, so eight clients queue for seconds on one worker and not on three.
PREFILL_SETTINGS = {"max_num_seqs": 1, "prefill_ms_per_token": 5.0, "enable_prefix_caching": False}
#: Fast decoding: ITL stays far inside its target whatever the load. No prefix cache:
#: the load repeats its prompts, and a cached prompt would be prefilled locally.
DECODE_SETTINGS = {"decode_base_ms": 2.0, "enable_prefix_caching": False}
#: Prompts longer than this (all of the load's) are prefilled on the prefill pool,
#: however long its queue (the decode worker's `--max-prefill-queue-size` is above the
#: load's eight clients, so it never falls back to prefilling locally).
MAX_LOCAL = 8
SCALE_BOUND = 60.0


def planner_yaml(path: Path, tmp_path: Path, model_dir: Path, frontend_port: int, namespace: str) -> Path:
    prefill = [*MOCKER, "--model-path", str(model_dir), "--endpoint", f"{namespace}.prefill.generate",
               "--role", "prefill", "--extra-engine-args", str(write_json(tmp_path / "prefill.json", PREFILL_SETTINGS))]
    decode = [*MOCKER, "--model-path", str(model_dir), "--endpoint", f"{namespace}.mocker.generate",
              "--role", "decode", "--max-local-prefill-length", str(MAX_LOCAL), "--max-prefill-queue-size", "64",
              "--extra-engine-args", str(write_json(tmp_path / "decode.json", DECODE_SETTINGS))]
    config = {
        "model": model_dir.name,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": 1000}, "itl": {"quantile": 0.9, "ms": 1000}},
        "roles": {
            "prefill": {"min_replicas": 1, "max_replicas": 3, "endpoint": f"{namespace}.prefill.generate",
                        "command": prefill},
            "decode": {"min_replicas": 1, "max_replicas": 2, "endpoint": f"{namespace}.mocker.generate",
                       "command": decode},
        },
        "intervals": {"load_s": 1.5, "throughput_s": 30},
        "stale_after_s": 5,
        "connector": {"kind": "local", "stop_timeout_s": 20},
    }
    path.write_text(json.dumps(config))
    return path


async def test_grows_and_shrinks_the_prefill_role_losing_nothing(
    backend: Any, workers: Any, namespace: str, model_dir: Path, tmp_path: Path
) -> None:
    frontend = launch_frontend(workers, "dyn", "--http-host", "127.0.0.1")
    port = frontend.port
    config = planner_yaml(tmp_path / "planner.yaml", tmp_path, model_dir, port, namespace)
    planner = Planner(workers, config)
    fleet, describe = planner.fleet, planner.describe

    await frontend.wait_live()
    # The planner starts the minimum of each role by itself.
    await frontend.wait_models([model_dir.name], timeout=SCALE_BOUND)
    await wait_until(lambda: fleet("prefill").get("ready") == 1 and fleet("decode").get("ready") == 1,
                     SCALE_BOUND, describe, ignore=(OSError,))

    heavy = Load(port, model_dir.name, clients=8)
    heavy.start()
    await wait_until(lambda: fleet("prefill").get("ready", 0) >= 2, SCALE_BOUND, describe, interval=0.2,
                     ignore=(OSError,))
    assert fleet("decode") == {"ready": 1, "pending": 0}, f"decode answers for ITL only: {describe()}"
    light = Load(port, model_dir.name, clients=1)
    light.start()
    await heavy.stop()
    await wait_until(lambda: fleet("prefill") == {"ready": 1, "pending": 0}, SCALE_BOUND, describe, interval=0.2,
                     ignore=(OSError,))
    await light.stop()

    outcomes = heavy.outcomes + light.outcomes
    bad = [o for o in outcomes if o.kind != "ok"]
    assert not bad, f"{len(bad)} of {len(outcomes)} requests failed: {[o.detail for o in bad[:5]]}"
    assert fleet("decode") == {"ready": 1, "pending": 0}, describe()
    decisions = planner.health()["decisions"]
    assert any(d["role"] == "prefill" and d["action"] == "down" and d["done"] for d in decisions), decisions

    await planner.stop()

"""The virtual connector's protocol on a real discovery backend (both backends): the
planner publishes a decision, an external actor carries it out and reports back."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from dynamo.planner.config import build_config
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind, make_connector


def planner_config(namespace: str, timeout: float) -> Any:
    return build_config({
        "model": "m",
        "connector": {"kind": "virtual", "prefix": f"v1/planner/{namespace}", "report_timeout_s": timeout},
        "roles": {"prefill": {"max_replicas": 4}, "decode": {"max_replicas": 4}},
    })


async def actor(kv: Any, prefix: str, role: str, carried: list[dict[str, Any]]) -> None:
    """An external actor: follows the role's decision and reports each one done."""
    last = 0
    while True:
        raw = await kv.kv_get(f"{prefix}/decision/{role}")
        decision = json.loads(raw) if raw else None
        if decision and decision["id"] > last:
            last = decision["id"]
            carried.append(decision)
            report = {"id": last, "ready": decision["replicas"], "pending": 0}
            await kv.kv_put(f"{prefix}/report/{role}", json.dumps(report).encode())
        await asyncio.sleep(0.05)


async def test_decisions_out_reports_back(runtime: Any, namespace: str) -> None:
    config = planner_config(namespace, timeout=10)
    connector = make_connector(config, runtime)
    kv = runtime.kv_store()
    # No report yet: nothing is known of the fleet.
    assert {r: (s.ready, s.pending) for r, s in (await connector.replicas()).items()} == {
        "prefill": (0, 0), "decode": (0, 0)
    }
    carried: list[dict[str, Any]] = []
    prefix = f"v1/planner/{namespace}"
    task = asyncio.ensure_future(actor(kv, prefix, "decode", carried))
    try:
        await asyncio.wait_for(connector.scale("decode", 3, "p90 ITL over target"), 15)
        await asyncio.wait_for(connector.scale("decode", 2, "2 replicas suffice"), 15)
    finally:
        task.cancel()
    assert [(d["id"], d["replicas"], d["role"]) for d in carried] == [(1, 3, "decode"), (2, 2, "decode")]
    assert carried[0]["reason"] == "p90 ITL over target"
    assert (await connector.replicas())["decode"].ready == 2
    # The actor's progress report (one asked for, not ready yet) is read as pending.
    await kv.kv_put(f"{prefix}/report/prefill", json.dumps({"id": 0, "ready": 1, "pending": 1}).encode())
    state = (await connector.replicas())["prefill"]
    assert (state.ready, state.pending) == (1, 1)


async def test_no_actor_is_a_timeout_error(runtime: Any, namespace: str) -> None:
    connector = make_connector(planner_config(namespace, timeout=0.5), runtime)
    with pytest.raises(ConnectorError, match=r"no report on .*/report/prefill for decision 1 within 0\.5s") as error:
        await connector.scale("prefill", 2, "test")
    assert error.value.kind is ConnectorErrorKind.TIMEOUT
    # The decision itself is published for whoever comes.
    raw = await runtime.kv_store().kv_get(f"v1/planner/{namespace}/decision/prefill")
    assert json.loads(raw)["replicas"] == 2

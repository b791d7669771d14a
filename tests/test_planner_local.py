"""The local connector with real mocker workers (embedded backend): start replicas and
see them ready in discovery, remove one by draining it, remove a pending replica before a
ready one, and stop everything at close."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dynamo.planner.config import build_config
from dynamo.planner.connector import ConnectorError
from dynamo.planner.connectors.local import LocalConnector
from helpers import alive, wait_until
from llm_helpers import MOCKER

READY_BOUND = 60.0


def planner_config(model_dir: Path, endpoint: str, delay: float = 0.0) -> Any:
    command = [*MOCKER, "--model-path", str(model_dir), "--endpoint", endpoint]
    return build_config({
        "model": model_dir.name,
        "roles": {"agg": {"min_replicas": 1, "max_replicas": 3, "endpoint": endpoint, "command": command}},
        "connector": {"kind": "local", "startup_delay_s": delay, "stop_timeout_s": 15},
    })


async def counts(connector: LocalConnector) -> tuple[int, int]:
    state = (await connector.replicas())["agg"]
    return state.ready, state.pending


@pytest.mark.parametrize("backend", ["embedded"], indirect=True)
@pytest.mark.timeout(150)
async def test_start_drain_and_pending_first(backend: Any, runtime: Any, namespace: str, model_dir: Path) -> None:
    endpoint = f"{namespace}.mocker.generate"
    connector = LocalConnector(planner_config(model_dir, endpoint))
    client = await runtime.endpoint(endpoint).client()
    try:
        await connector.scale("agg", 2, "test: two")
        assert await counts(connector) == (0, 2)
        await wait_until(lambda: _ready(connector) == 2, READY_BOUND, "two workers ready")
        await wait_until(lambda: len(client.instance_ids()) == 2, READY_BOUND, "two instances in discovery")
        first, second = connector.fleet["agg"]
        assert first.proc is not None and second.proc is not None

        # Down to one: the newest (second) drains and leaves discovery; the first stays.
        await connector.scale("agg", 1, "test: one")
        assert await counts(connector) == (1, 0)
        await wait_until(lambda: second.proc.returncode is not None, READY_BOUND, "the drained worker to exit")
        assert second.proc.returncode == 0, "a drained worker exits 0"
        await wait_until(lambda: len(client.instance_ids()) == 1, READY_BOUND, "one instance left")

        # A replica that stays pending (its start held back) is removed before a ready one.
        connector.settings.startup_delay_s = 60.0
        await connector.scale("agg", 2, "test: a slow start")
        assert await counts(connector) == (1, 1)
        await connector.scale("agg", 1, "test: not needed after all")
        assert await counts(connector) == (1, 0)
        assert connector.fleet["agg"] == [first] and first.proc.returncode is None
    finally:
        await connector.close()
    assert await counts(connector) == (0, 0)
    assert not alive(first.proc.pid) and first.proc.returncode == 0
    await wait_until(lambda: not client.instance_ids(), READY_BOUND, "no instance left")


def _ready(connector: LocalConnector) -> int:
    return sum(r.ready_at is not None for r in connector.fleet["agg"])


async def test_an_empty_command_is_refused() -> None:
    with pytest.raises(ConnectorError, match="command is empty"):
        await LocalConnector(build_config({"model": "m"})).scale("agg", 1, "test")

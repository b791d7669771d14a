"""The planner process's loop, its /health and its /metrics: a missing frontend is a visible
state (signal, /health 503, a metric, decisions that hold naming it), advisory mode never
acts, decisions and failed changes are counted, and a bad configuration stops `python -m
dynamo.planner` with the key named."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

from dynamo.planner.config import build_config
from dynamo.planner.connector import ConnectorError, ConnectorErrorKind
from dynamo.planner.decide import Decider, RoleState
from dynamo.planner.health import HealthServer
from dynamo.planner.loop import Planner
from dynamo.planner.observe import FrontendObserver, FrontendWindow, LoadReports, SignalState
from dynamo.planner.profile import PerformanceModel, Profile
from helpers import free_port
from llm_helpers import planner_metrics


class RecordingConnector:
    """A connector over a fleet held in memory: it records what it is asked."""

    name = "recording"

    def __init__(self, ready: int) -> None:
        self.ready = ready
        self.pending = 0
        self.calls: list[tuple[str, int]] = []

    async def replicas(self) -> dict[str, RoleState]:
        return {"agg": RoleState(ready=self.ready, pending=self.pending)}

    async def scale(self, role: str, target: int, reason: str) -> None:
        self.calls.append((role, target))
        self.ready = target

    async def close(self) -> None:
        pass


def planner(advisory: bool, min_replicas: int = 1) -> tuple[Planner, RecordingConnector]:
    config = build_config({
        "model": "m", "advisory": advisory, "frontend_metrics_url": f"http://127.0.0.1:{free_port()}/metrics",
        "roles": {"agg": {"min_replicas": min_replicas, "max_replicas": 4}},
    })
    frontend = FrontendObserver(config.frontend_metrics_url, "m", config.stale_after_s, 0.9, 0.9)
    connector = RecordingConnector(ready=2)
    return Planner(config, connector, frontend, Decider(config)), connector


def get(port: int) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def served(p: Planner) -> tuple[int, dict[str, Any], str, dict[Any, float]]:
    """The planner's ``/health`` (status, body) and ``/metrics`` (content type, samples),
    from its HTTP server on a free port."""
    server = HealthServer(p.health, metrics=p.metrics)
    port = await server.start()
    try:
        status, body = await asyncio.to_thread(get, port)
        kind, samples = await asyncio.to_thread(planner_metrics, port)
    finally:
        await server.close()
    return status, body, kind, samples


async def test_a_missing_frontend_is_visible_and_holds() -> None:
    p, connector = planner(advisory=False)
    decisions = await p.load_pass()
    assert [(d.action, d.missing) for d in decisions] == [("hold", ("frontend_metrics",))]
    assert connector.calls == []
    status, body, kind, samples = await served(p)
    assert kind.startswith("text/plain; version=0.0.4")
    state = "dynamo_planner_signal_state"
    assert samples[(state, (("signal", "frontend_metrics"), ("state", "missing")))] == 1.0
    assert samples[(state, (("signal", "frontend_metrics"), ("state", "ok")))] == 0.0
    assert samples[(state, (("signal", "connector"), ("state", "ok")))] == 1.0
    assert samples[("dynamo_planner_replicas", (("role", "agg"), ("state", "ready")))] == 2.0
    assert samples[("dynamo_planner_decisions_total", (("action", "hold"), ("loop", "load"), ("role", "agg")))] == 1.0
    assert status == 503 and body["status"] == "degraded"
    assert body["signals"]["frontend_metrics"]["state"] == "missing"
    assert "Connection refused" in body["signals"]["frontend_metrics"]["detail"]
    assert body["fleet"] == {"agg": {"ready": 2, "pending": 0}}
    assert body["decisions"][-1]["missing"] == ["frontend_metrics"]
    # The throughput loop (its pass rides on a load pass), with no window at all, holds
    # and says why too.
    decisions = await p.load_pass(throughput=True)
    assert [(d.loop, d.action, d.missing) for d in decisions] == [
        ("throughput", "hold", ("frontend_metrics",)), ("load", "hold", ("frontend_metrics",)),
    ]


async def test_advisory_mode_decides_but_never_acts() -> None:
    p, connector = planner(advisory=True, min_replicas=3)
    [decision] = await p.load_pass()
    assert (decision.action, decision.target) == ("up", 3)
    assert connector.calls == [] and p.decisions[-1]["done"] is False
    acting, connector = planner(advisory=False, min_replicas=3)
    await acting.load_pass()
    assert connector.calls == [("agg", 3)] and acting.decisions[-1]["done"] is True


class RefusingConnector(RecordingConnector):
    """Reads the fleet, refuses every change."""

    async def scale(self, role: str, target: int, reason: str) -> None:
        raise ConnectorError(ConnectorErrorKind.UNREACHABLE, "the cluster is away")


async def test_metrics_count_decisions_and_the_changes_that_failed() -> None:
    p, connector = planner(advisory=False, min_replicas=3)
    await p.load_pass()  # 2 -> 3, made
    p.connector = refusing = RefusingConnector(ready=1)
    await p.load_pass()  # 1 -> 3, refused
    assert connector.calls == [("agg", 3)] and refusing.calls == []
    *_, samples = await served(p)
    assert samples[("dynamo_planner_decisions_total", (("action", "up"), ("loop", "load"), ("role", "agg")))] == 2.0
    assert samples[("dynamo_planner_scale_failures_total", (("role", "agg"),))] == 1.0
    assert samples[("dynamo_planner_signal_state", (("signal", "connector"), ("state", "missing")))] == 1.0
    assert samples[("dynamo_planner_advisory", ())] == 0.0


async def test_health_and_metrics_show_the_workers_load_reports() -> None:
    p, _ = planner(advisory=False)
    p.reports = {"agg": LoadReports(stale_after_s=60.0)}
    for worker, hit in ((1, 0.25), (2, 0.75)):
        p.reports["agg"].add({
            "worker_id": worker, "num_requests_waiting": worker, "request_active_slots": 4,
            "kv_active_blocks": 10, "kv_total_blocks": 40, "gpu_prefix_cache_hit_rate": hit,
        })
    _, body, _, samples = await served(p)
    assert body["load"] == {"agg": {
        "reporting": 2, "waiting": 3, "running": 8, "kv_active_blocks": 20, "kv_total_blocks": 80,
        "kv_usage": 0.25, "prefix_hit_rate": 0.5,
    }}
    assert samples[("dynamo_planner_workers_reporting", (("role", "agg"),))] == 2.0
    assert samples[("dynamo_planner_worker_requests", (("role", "agg"), ("state", "waiting")))] == 3.0
    assert samples[("dynamo_planner_worker_requests", (("role", "agg"), ("state", "running")))] == 8.0
    assert samples[("dynamo_planner_worker_kv_blocks", (("role", "agg"), ("state", "total")))] == 80.0
    assert samples[("dynamo_planner_worker_prefix_cache_hit_rate", (("role", "agg"),))] == 0.5


async def test_the_urgent_pass_acts_on_a_queue_the_load_reports_show_building() -> None:
    p, connector = planner(advisory=False)
    points = [
        {"isl": 128, "concurrency": c, "ttft_ms": 100.0 * c, "itl_ms": 10.0 * c, "throughput_rps": float(c)}
        for c in (1, 2, 4, 8, 16)
    ]
    p.decider.model = PerformanceModel(Profile.model_validate({"points": points}))
    reports = p.reports["agg"] = LoadReports(p.config.stale_after_s)
    fleet = await p.connector.replicas()
    # What a load pass left: 2 req/s of 128-token prompts on the 2 ready replicas.
    window = FrontendWindow(seconds=10, request_rate=2.0, inflight=2, isl=128, osl=None, ttft_ms=200, itl_ms=20)
    p.state.load_step(window, fleet, {"agg": 0}, (), time.monotonic())
    for waiting in (0, 1, 1):  # no backlog: the fleet is not even read
        reports.add({"worker_id": 1, "num_requests_waiting": waiting})
        assert await p.urgent_pass() == []
    for waiting in (30, 60, 90):  # three rises past the ready replicas: one scale-up
        reports.add({"worker_id": 1, "num_requests_waiting": waiting})
        decisions = await p.urgent_pass()
    assert [(d.loop, d.action) for d in decisions] == [("urgent", "up")]
    assert connector.calls == [("agg", decisions[0].target)] and decisions[0].target > 2
    assert p.decisions[-1]["loop"] == "urgent" and p.decisions[-1]["done"] is True
    # The replicas it asked for are starting when the next pass reads the fleet: they
    # have been since the urgent check's ask (made after its own read of the fleet), not
    # since that pass saw them.
    asked = p.state.asked_at["agg"]
    connector.ready, connector.pending = 2, decisions[0].target - 2
    await p.load_pass()
    assert p.state.noted_at is not None and p.state.noted_at > asked
    assert p.state.pending_since["agg"] == asked


def test_a_bad_configuration_exits_2_naming_the_key(tmp_path) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text("model: m\nintervals: {load_s: soon}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "dynamo.planner", "--config", str(path), "--set", "roles.agg.max_replicas=many"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert "intervals.load_s" in proc.stderr and "roles.agg.max_replicas" in proc.stderr


async def test_requests_held_at_a_busy_frontend_are_a_backlog_that_keeps_the_fleet() -> None:
    """The frontend's `--busy-wait-s` hold (every worker busy) is a backlog: a window whose
    own rate would let one replica of two go keeps both while requests are held."""

    async def decided(held: int) -> Any:
        p, _ = planner(advisory=True)
        window = FrontendWindow(
            seconds=10.0, request_rate=1.0, inflight=2.0, isl=100.0, osl=10.0, ttft_ms=50.0, itl_ms=5.0,
            held_busy=held,
        )

        async def scrape() -> FrontendWindow:
            return window

        p.frontend.scrape = scrape  # type: ignore[method-assign]
        p.frontend.signal = SignalState("ok")
        [decision] = await p.load_pass()
        return decision

    quiet = await decided(held=0)
    assert (quiet.action, quiet.target) == ("down", 1), quiet
    held = await decided(held=7)
    assert held.action != "down" and "7 request(s) waiting" in held.reason, held

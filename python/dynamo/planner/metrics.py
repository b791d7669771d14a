"""The planner's own ``/metrics``: what ``/health`` shows, in the Prometheus text format,
for the dashboards and alerts that already scrape the frontend and the workers.

Read from the planner at each scrape (a collector over its state, no copy kept); each
metric and its labels are in docs/planner.md, "Observing the planner".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from dynamo.planner.loop import Planner

#: The states a signal can be in.
SIGNAL_STATES = ("ok", "missing", "stale")

#: The ``Content-Type`` of ``render``'s output.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class PlannerCollector(Collector):
    """Each scrape's metrics, read from one planner."""

    def __init__(self, planner: Planner) -> None:
        self.planner = planner

    def collect(self) -> Iterator[Metric]:
        p, now = self.planner, time.monotonic()
        state = GaugeMetricFamily(
            "dynamo_planner_signal_state", "1 for the signal's current state, 0 for the others",
            labels=["signal", "state"],
        )
        age = GaugeMetricFamily(
            "dynamo_planner_signal_state_seconds", "Seconds the signal has been in its state", labels=["signal"]
        )
        for name, signal in sorted(p.signals.items()):
            for s in SIGNAL_STATES:
                state.add_metric([name, s], 1.0 if signal.state == s else 0.0)
            age.add_metric([name], now - signal.since)
        yield state
        yield age

        replicas = GaugeMetricFamily(
            "dynamo_planner_replicas", "Replicas as last read from the connector", labels=["role", "state"]
        )
        for role, fleet in sorted(p.fleet.items()):
            replicas.add_metric([role, "ready"], fleet.ready)
            replicas.add_metric([role, "pending"], fleet.pending)
        yield replicas

        reporting = GaugeMetricFamily(
            "dynamo_planner_workers_reporting", "Workers with a fresh load report", labels=["role"]
        )
        requests = GaugeMetricFamily(
            "dynamo_planner_worker_requests", "Requests in the workers' engines, by their load reports",
            labels=["role", "state"],
        )
        blocks = GaugeMetricFamily(
            "dynamo_planner_worker_kv_blocks", "KV cache blocks of the workers, by their load reports",
            labels=["role", "state"],
        )
        hits = GaugeMetricFamily(
            "dynamo_planner_worker_prefix_cache_hit_rate", "The mean of the workers' prefix-cache hit rates",
            labels=["role"],
        )
        for role, reports in sorted(p.reports.items()):
            load = reports.load(now)
            reporting.add_metric([role], load.reporting)
            requests.add_metric([role, "waiting"], load.waiting)
            requests.add_metric([role, "running"], load.running)
            blocks.add_metric([role, "active"], load.kv_active_blocks)
            blocks.add_metric([role, "total"], load.kv_total_blocks)
            if load.prefix_hit_rate is not None:
                hits.add_metric([role], load.prefix_hit_rate)
        yield from (reporting, requests, blocks, hits)

        decider = p.decider
        floors = GaugeMetricFamily(
            "dynamo_planner_floor_replicas", "The floor of the last throughput pass", labels=["role"]
        )
        for role, floor in sorted(decider.floors.items()):
            floors.add_metric([role], floor)
        yield floors
        forecast = GaugeMetricFamily(
            "dynamo_planner_forecast_requests_per_second", "The last throughput pass's demand forecast",
            labels=["role"],
        )
        capacity = GaugeMetricFamily(
            "dynamo_planner_replica_capacity_requests_per_second",
            "What one replica serves within the targets by the corrected profile, at the last throughput pass",
            labels=["role"],
        )
        for role, (rate, _trend, per_replica, _at) in sorted(decider.last_pass.items()):
            forecast.add_metric([role], rate)
            capacity.add_metric([role], per_replica)
        yield forecast
        yield capacity

        decisions = CounterMetricFamily(
            "dynamo_planner_decisions", "Decisions made, acted on or not", labels=["role", "loop", "action"]
        )
        for (role, loop, action), n in sorted(p.decision_counts.items()):
            decisions.add_metric([role, loop, action], n)
        yield decisions
        failures = CounterMetricFamily(
            "dynamo_planner_scale_failures", "Changes the connector refused or could not make", labels=["role"]
        )
        for role, n in sorted(p.scale_failures.items()):
            failures.add_metric([role], n)
        yield failures

        if decider.model is not None:
            factor = GaugeMetricFamily(
                "dynamo_planner_correction_factor", "The live correction of the profile (observed / predicted)",
                labels=["latency"],
            )
            factor.add_metric(["ttft"], decider.model.correction.ttft_factor)
            factor.add_metric(["itl"], decider.model.correction.itl_factor)
            yield factor
        yield GaugeMetricFamily("dynamo_planner_advisory", "1 when the planner only advises", float(p.config.advisory))


def render(planner: Planner) -> bytes:
    """The planner's metrics in the Prometheus text format (``CONTENT_TYPE``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(PlannerCollector(planner))
    return generate_latest(registry)

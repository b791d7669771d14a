"""Observing the fleet: windows of the frontend's Prometheus metrics, signal states when
the frontend is unreachable or gone quiet, and the workers' load reports on the event
plane (a real subscription on both backends)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from dynamo.planner.observe import (
    FleetLoad,
    FrontendObserver,
    FrontendWindow,
    Histogram,
    LoadReports,
    observation,
    parse_frontend,
)
from helpers import free_port, wait_until

MODEL = "m"


def metrics_text(requests: int, inflight: int, ttft_buckets: dict[str, int], isl_sum: float) -> str:
    """The frontend's exposition (the shapes of lib/llm/src/http/metrics.rs), for MODEL
    and another model that must be ignored."""
    count = max(ttft_buckets.values())
    lines = [
        "# HELP dynamo_frontend_requests_total Requests",
        "# TYPE dynamo_frontend_requests_total counter",
        f'dynamo_frontend_requests_total{{endpoint="chat_completions",model="{MODEL}",request_type="stream",'
        f'status="success"}} {requests}',
        'dynamo_frontend_requests_total{endpoint="chat_completions",model="other",request_type="stream",'
        'status="success"} 1000',
        "# HELP dynamo_frontend_inflight_requests In flight",
        "# TYPE dynamo_frontend_inflight_requests gauge",
        f'dynamo_frontend_inflight_requests{{model="{MODEL}"}} {inflight}',
        "# HELP dynamo_frontend_time_to_first_token_seconds TTFT",
        "# TYPE dynamo_frontend_time_to_first_token_seconds histogram",
        *(f'dynamo_frontend_time_to_first_token_seconds_bucket{{model="{MODEL}",le="{le}"}} {n}'
          for le, n in ttft_buckets.items()),
        f'dynamo_frontend_time_to_first_token_seconds_sum{{model="{MODEL}"}} 1.0',
        f'dynamo_frontend_time_to_first_token_seconds_count{{model="{MODEL}"}} {count}',
        "# HELP dynamo_frontend_input_sequence_tokens ISL",
        "# TYPE dynamo_frontend_input_sequence_tokens histogram",
        f'dynamo_frontend_input_sequence_tokens_bucket{{model="{MODEL}",le="+Inf"}} {requests}',
        f'dynamo_frontend_input_sequence_tokens_sum{{model="{MODEL}"}} {isl_sum}',
        f'dynamo_frontend_input_sequence_tokens_count{{model="{MODEL}"}} {requests}',
    ]
    return "\n".join(lines) + "\n"


def test_histogram_quantiles_interpolate_like_prometheus() -> None:
    h = Histogram({0.1: 50, 0.2: 90, 0.4: 100, float("inf"): 100}, total=15.0, count=100)
    assert h.quantile(0.5) == pytest.approx(0.1)
    assert h.quantile(0.7) == pytest.approx(0.15)
    assert h.quantile(0.95) == pytest.approx(0.3)
    assert Histogram().quantile(0.9) is None
    beyond = Histogram({0.1: 0, float("inf"): 10}, count=10)
    assert beyond.quantile(0.9) == pytest.approx(0.1)


def test_a_window_is_the_difference_of_two_scrapes() -> None:
    first = parse_frontend(metrics_text(10, 2, {"0.1": 10, "0.2": 10, "+Inf": 10}, 1000), MODEL, at=100.0)
    second = parse_frontend(metrics_text(30, 4, {"0.1": 10, "0.2": 28, "+Inf": 30}, 5000), MODEL, at=110.0)
    assert first.exported and (first.requests, first.inflight) == (10, 2)
    window = FrontendWindow.between(first, second, ttft_q=0.9, itl_q=0.9)
    # 20 ended + 2 more in flight over 10 s; 20 new TTFTs, the 90th (18th) at 0.2 s.
    assert window.request_rate == pytest.approx(2.2)
    assert window.ttft_ms == pytest.approx(200.0)
    assert window.isl == pytest.approx(200.0)
    assert window.itl_ms is None  # no ITL series: no value, not zero
    # A restarted frontend (counters went back) counts from zero, never negative.
    restarted = parse_frontend(metrics_text(3, 0, {"0.1": 3, "+Inf": 3}, 300), MODEL, at=120.0)
    assert FrontendWindow.between(second, restarted, 0.9, 0.9).request_rate == pytest.approx(0.0, abs=0.31)


def test_demand_at_zero_workers_is_read_from_the_frontend() -> None:
    """Requests waiting for a worker now, plus those that found none between two scrapes."""

    def page(arrived: int, waiting: int) -> str:
        return metrics_text(requests=0, inflight=waiting, ttft_buckets={float("inf"): 0}, isl_sum=0) + "\n".join([
            "# TYPE dynamo_frontend_requests_without_workers_total counter",
            f'dynamo_frontend_requests_without_workers_total{{model="{MODEL}"}} {arrived}',
            'dynamo_frontend_requests_without_workers_total{model="other"} 50',
            "# TYPE dynamo_frontend_requests_waiting_for_workers gauge",
            f'dynamo_frontend_requests_waiting_for_workers{{model="{MODEL}"}} {waiting}',
        ]) + "\n"

    first, second = parse_frontend(page(2, 0), MODEL, 0.0), parse_frontend(page(5, 1), MODEL, 2.0)
    assert (second.without_workers, second.waiting_for_workers) == (5, 1)
    window = FrontendWindow.between(first, second, 0.9, 0.9)
    assert window.waiting_for_workers == 1 + 3
    assert observation(window, 0, ()).waiting_for_workers == 4
    assert FrontendWindow.between(second, second, 0.9, 0.9).waiting_for_workers == 1


def test_requests_held_while_every_worker_is_busy_are_read_from_the_frontend() -> None:
    """`--busy-wait-s`: the requests held now, at the later scrape, for this model only."""

    def page(held: int) -> str:
        return metrics_text(requests=0, inflight=held, ttft_buckets={float("inf"): 0}, isl_sum=0) + "\n".join([
            "# TYPE dynamo_frontend_requests_waiting_for_capacity gauge",
            f'dynamo_frontend_requests_waiting_for_capacity{{model="{MODEL}"}} {held}',
            'dynamo_frontend_requests_waiting_for_capacity{model="other"} 40',
        ]) + "\n"

    first, second = parse_frontend(page(5), MODEL, 0.0), parse_frontend(page(2), MODEL, 2.0)
    assert (first.held_busy, second.held_busy) == (5, 2)
    assert FrontendWindow.between(first, second, 0.9, 0.9).held_busy == 2


def test_a_page_without_the_families_is_not_a_frontend() -> None:
    assert not parse_frontend("# TYPE other_total counter\nother_total 1\n", MODEL, 0.0).exported
    # A frontend that has not served the model yet: exported, zeros.
    empty = parse_frontend(metrics_text(0, 0, {"+Inf": 0}, 0).replace(f'model="{MODEL}"', 'model="x"'), MODEL, 0.0)
    assert empty.exported and empty.requests == 0
    # A frontend that has served no request at all: only the scrapes' own responses.
    fresh = 'dynamo_frontend_responses_total{endpoint="/metrics",status="200"} 1\n'
    fresh_snap = parse_frontend(fresh, MODEL, 0.0)
    assert fresh_snap.exported and fresh_snap.requests == 0


@pytest.fixture
def metrics_server() -> Iterator[dict[str, Any]]:
    """A loopback server answering /metrics with `state["text"]` (404 when None)."""
    state: dict[str, Any] = {"text": None}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            text = state["text"]
            body = (text or "").encode()
            self.send_response(200 if text is not None else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


async def test_signal_states_of_the_frontend(metrics_server: dict[str, Any]) -> None:
    unreachable = FrontendObserver(f"http://127.0.0.1:{free_port()}/metrics", MODEL, 5.0, 0.9, 0.9)
    assert await unreachable.scrape() is None
    assert unreachable.signal.state == "missing" and "Connection refused" in unreachable.signal.detail
    missing = observation(None, 0, ())
    assert missing.missing == ("frontend_metrics",) and missing.request_rate is None

    observer = FrontendObserver(metrics_server["url"], MODEL, stale_after_s=0.2, ttft_q=0.9, itl_q=0.9)
    assert await observer.scrape() is None and "404" in observer.signal.detail
    metrics_server["text"] = "# TYPE up gauge\nup 1\n"
    assert await observer.scrape() is None and "exports no" in observer.signal.detail
    metrics_server["text"] = metrics_text(1, 0, {"0.1": 1, "+Inf": 1}, 10)
    assert await observer.scrape() is None and observer.signal.detail == "first scrape: a window needs two"
    metrics_server["text"] = metrics_text(5, 0, {"0.1": 5, "+Inf": 5}, 50)
    window = await observer.scrape()
    assert window is not None and observer.signal.state == "ok" and window.request_rate > 0
    # The frontend goes away: missing at first, stale once the last good scrape is old.
    metrics_server["text"] = None
    await asyncio.sleep(0.3)
    assert await observer.scrape() is None and observer.signal.state == "stale"


def test_load_reports_go_stale() -> None:
    reports = LoadReports(stale_after_s=5.0)
    reports.add({"worker_id": 1, "num_requests_waiting": 2}, now=100.0)
    reports.add({"worker_id": 2, "num_requests_waiting": 3}, now=104.0)
    reports.add({"no": "worker"}, now=104.0)
    assert reports.waiting(now=104.5) == 5 and reports.stale(104.5) == []
    assert reports.stale(now=106.0) == [1] and reports.waiting(now=106.0) == 3
    reports.forget([1])
    assert reports.stale(now=106.0) == []


def test_the_fresh_reports_sum_to_the_role_s_load() -> None:
    reports = LoadReports(stale_after_s=5.0)
    assert reports.load(now=0.0) == FleetLoad() and FleetLoad().kv_usage is None
    full = {"request_active_slots": 3, "kv_active_blocks": 30, "kv_total_blocks": 100}
    reports.add({"worker_id": 1, "num_requests_waiting": 1, "gpu_prefix_cache_hit_rate": 0.5, **full}, now=100.0)
    reports.add({"worker_id": 2, "num_requests_waiting": 2, "gpu_prefix_cache_hit_rate": 0.1, **full}, now=104.0)
    reports.add({"worker_id": 3, "request_active_slots": "?", "kv_total_blocks": 100}, now=104.0)  # no rate
    load = reports.load(now=104.5)
    assert (load.reporting, load.waiting, load.running) == (3, 3, 6)
    assert (load.kv_active_blocks, load.kv_total_blocks, load.kv_usage) == (60, 300, 0.2)
    assert load.prefix_hit_rate == pytest.approx(0.3)  # the two that report one
    # Worker 1 goes stale: its queue, its blocks and its rate leave the sums.
    later = reports.load(now=106.0)
    assert (later.reporting, later.waiting, later.kv_total_blocks) == (2, 2, 200)
    assert later.prefix_hit_rate == pytest.approx(0.1)
    assert later.as_dict() == {
        "reporting": 2, "waiting": 2, "running": 3, "kv_active_blocks": 30, "kv_total_blocks": 200,
        "kv_usage": 0.15, "prefix_hit_rate": 0.1,
    }


async def test_load_reports_follow_the_event_plane(runtime: Any, namespace: str) -> None:
    component = runtime.namespace(namespace).component("mocker")
    reports = LoadReports(stale_after_s=5.0)
    follower = asyncio.ensure_future(reports.follow(await component.subscribe("load_metrics")))
    try:
        await component.publish("load_metrics", {"worker_id": 7, "num_requests_waiting": 4, "kv_active_blocks": 9})
        await wait_until(lambda: 7 in reports.latest, 10, "a load report")
        assert reports.waiting(time.monotonic()) == 4
        assert reports.latest[7][1]["kv_active_blocks"] == 9
    finally:
        follower.cancel()

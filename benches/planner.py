"""The planner in real processes: an HTTP frontend, ``python -m dynamo.planner`` with its
``local`` connector, and the mocker workers it starts and drains, under an open-loop ramp
(Poisson arrivals, base → peak → base req/s, by default 2 → 20 → 2 over 5 minutes) or,
with ``--workload step``, a step (a third of the time at base, a third at peak, a third
at base again: 2 → 20 → 2 req/s, 100 s each over the default 5 minutes). The
same arrivals then run against a static fleet sized for the peak (by default the most
replicas the planner held; ``--static-replicas``), held by a planner whose min and max are
that size. Prints one row per configuration with the planner lab's figures (``--json``
writes them as a list of rows):

* ``sla_attainment``: fraction of requests within both targets (TTFT ≤ ``--ttft-ms`` and
  mean inter-token gap ≤ ``--itl-ms``; a failed request is not within);
* ``gpu_hours``: replica-seconds times GPUs per replica / 3600, replicas (ready + starting)
  sampled from the planner's ``/health`` every ``SAMPLE_S``, from the first send to the
  last answer;
* ``goodput_per_gpu``: requests within the targets per GPU-hour;
* ``scale_events``: changes of the fleet size; ``reversals``: changes of direction;
* ``failed_at_scale_down``: failed requests in flight when the fleet shrank;
* ``recovery_s``: ramp: the longest stretch of consecutive ``BIN_S`` bins (by send time)
  whose p90 TTFT or p90 inter-token gap broke its target; step (as the planner lab has
  it, from the load step to the targets met again): from the step up to the end of the
  stretch of broken bins that starts at or after it (0: no bin after the step broke);
* ``first_up_s`` (step): from the step to the first sample of a fleet larger than at the
  step; ``urgent_ups``: scale-ups the planner's urgent check asked for (its log);
* ``to_min_s`` (planner): from the last send to the first sample of the fleet back at its
  minimum (one replica); the bench samples the fleet for up to ``--tail-seconds`` after
  the last answer for it (``-``: not within them). The GPU hours, the scale events and
  the reversals stop at the last answer.

Run: ``python benches/planner.py [--minutes 5] [--json out.json]`` (needs only the wheel;
embedded backend, mocker workers with the built-in byte-level card; ``--backend etcd``
starts an etcd and a nats-server of its own and runs on those). Figures and the
command that made them: docs/performance.md, "The planner in real processes".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynamo.planner.decide import count_reversals
from dynamo.planner.lab import first_broken_run_end
from serving_load import (
    REQUEST_ERRORS,
    Connection,
    Processes,
    free_port,
    percentile,
    start_etcd,
    start_nats,
    wait_for_models,
    wait_until,
)

DYNAMO_RUN = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()"]
MODEL = "planner-bench"
ENDPOINT = "bench.mocker.generate"
#: A worker runs 4 sequences at a time, 25 ms per decode step: a 20-token request holds a
#: slot ~0.5 s, so one worker meets the targets up to a few req/s and the peak needs several.
MOCKER_SETTINGS = {"max_num_seqs": 4, "decode_base_ms": 25.0}
MAX_TOKENS = 20
#: Seconds between two samples of the fleet, and the width of a latency bin.
SAMPLE_S = 0.5
BIN_S = 5.0
#: Bound on one request (s).
REQUEST_TIMEOUT = 120.0


@dataclass
class Record:
    """One request of the ramp."""

    sent: float
    ended: float = 0.0
    ok: bool = False
    ttft: float = math.inf
    gap: float = math.inf
    error: str = ""


@dataclass
class Run:
    """What one configuration saw."""

    config: str
    records: list[Record] = field(default_factory=list)
    #: (time, replicas) samples of the fleet.
    fleet: list[tuple[float, int]] = field(default_factory=list)
    #: When the offsets count from (the monotonic clock of ``Record.sent``).
    began: float = 0.0
    #: Scale-ups the planner's urgent check asked for (its log).
    urgent_ups: int = 0
    #: The planner's min replicas (``to_min_s``), and how long the fleet is sampled after
    #: the last answer for it to get back there.
    least: int = 1
    tail_s: float = 0.0


def ramp_rate(t: float, seconds: float, base: float, peak: float) -> float:
    """Requests/s at ``t``: base → peak over the first 40 %, peak for 20 %, back to base."""
    x = t / seconds
    if x < 0.4:
        return base + (peak - base) * x / 0.4
    if x < 0.6:
        return peak
    return peak - (peak - base) * min(1.0, (x - 0.6) / 0.4)


def step_rate(t: float, seconds: float, base: float, peak: float) -> float:
    """Requests/s at ``t``: base for the first third, peak for the second, base again."""
    return peak if seconds / 3 <= t < 2 * seconds / 3 else base


#: Each workload's rate (req/s) at a time.
WORKLOADS = {"ramp": ramp_rate, "step": step_rate}


def step_at(workload: str, seconds: float) -> float | None:
    """Seconds from the start of the sends to the load step of ``workload`` (``None``: it
    has none)."""
    return seconds / 3 if workload == "step" else None


def arrivals(workload: str, seconds: float, base: float, peak: float, seed: int) -> list[float]:
    """Send times of a Poisson process whose rate follows the workload (thinning)."""
    rate = WORKLOADS[workload]
    rng = random.Random(seed)
    t, out = 0.0, []
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return out
        if rng.random() < rate(t, seconds, base, peak) / peak:
            out.append(t)


def body(i: int) -> bytes:
    words = " ".join(f"w{(i * 7 + k) % 50}" for k in range(40))
    return json.dumps({
        "model": MODEL, "stream": True, "max_tokens": MAX_TOKENS,
        "messages": [{"role": "user", "content": f"request {i}: {words}"}],
    }).encode()


async def send_all(port: int, offsets: list[float], start: float) -> list[Record]:
    """Open loop: each request at its time after ``start``, on an idle keep-alive
    connection or a new one."""
    idle: list[Connection] = []
    records: list[Record] = []

    async def one(i: int, at: float) -> None:
        delay = start + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        record = Record(sent=time.monotonic())
        records.append(record)
        conn = idle.pop() if idle else Connection(port)
        try:
            sample = await asyncio.wait_for(conn.stream("/v1/chat/completions", body(i)), REQUEST_TIMEOUT)
        except REQUEST_ERRORS as e:
            record.error = repr(e)[:200]
            await conn.close()
        else:
            record.ok = sample.tokens > 0
            record.error = "" if record.ok else "no token"
            record.ttft = sample.ttft
            record.gap = sample.tpot if sample.tpot is not None else 0.0
            if conn.is_open:
                idle.append(conn)
        finally:
            record.ended = time.monotonic()

    try:
        await asyncio.gather(*(one(i, at) for i, at in enumerate(offsets)))
    finally:
        for conn in idle:
            await conn.close()
    return records


def planner_fleet(port: int) -> int:
    """Replicas (ready + starting) the planner holds now."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            report = json.load(r)
    except urllib.error.HTTPError as e:  # 503 while a signal is not ok: same body
        report = json.load(e)
    agg = report.get("fleet", {}).get("agg", {})
    return int(agg.get("ready", 0)) + int(agg.get("pending", 0))


async def sample_fleet(port: int, run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            replicas = await asyncio.to_thread(planner_fleet, port)
            run.fleet.append((time.monotonic(), replicas))
        except (OSError, ValueError):
            pass
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), SAMPLE_S)


async def drive(frontend_port: int, planner_port: int, offsets: list[float], run: Run) -> None:
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_fleet(planner_port, run, stop))
    try:
        run.began = time.monotonic()
        run.records = await send_all(frontend_port, offsets, run.began)
        bound = time.monotonic() + run.tail_s
        while time.monotonic() < bound and (not run.fleet or run.fleet[-1][1] > run.least):
            await asyncio.sleep(SAMPLE_S)
    finally:
        stop.set()
        await sampler


def planner_config(args: argparse.Namespace, frontend_port: int, settings: Path, least: int, most: int) -> dict:
    command = [sys.executable, "-m", "dynamo.mocker", "--model-name", MODEL, "--endpoint", ENDPOINT,
               "--extra-engine-args", str(settings)]
    return {
        "model": MODEL,
        "frontend_metrics_url": f"http://127.0.0.1:{frontend_port}/metrics",
        "targets": {"ttft": {"quantile": 0.9, "ms": args.ttft_ms}, "itl": {"quantile": 0.9, "ms": args.itl_ms}},
        "roles": {"agg": {"min_replicas": least, "max_replicas": most, "gpus_per_replica": 1, "endpoint": ENDPOINT,
                          "command": command}},
        "intervals": {"load_s": args.load_interval, "throughput_s": 30, "urgent_s": args.urgent_interval},
        "stale_after_s": 10,
        "profile": str(args.profile) if args.profile else None,
        "connector": {"kind": "local", "startup_delay_s": args.startup_delay, "stop_timeout_s": 30},
    }


def run_config(name: str, args: argparse.Namespace, log_dir: Path, least: int, most: int,
               offsets: list[float]) -> Run:
    """Frontend + planner (which starts the workers), the ramp, then everything stopped."""
    log_dir.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    kv = log_dir / "kv"
    kv.mkdir(exist_ok=True)
    env.update({"DYN_LOG": os.environ.get("DYN_LOG", "warn"), "DYN_DISCOVERY_BACKEND": "file",
                "DYN_FILE_KV": str(kv), "DYN_REQUEST_PLANE": "tcp", "DYN_EVENT_PLANE": "tcp",
                "DYN_TCP_HOST": "127.0.0.1"})
    env["DYN_LOG"] = f"{env['DYN_LOG']},dynamo.planner=info"
    settings = log_dir / "mocker.json"
    settings.write_text(json.dumps(MOCKER_SETTINGS))
    frontend_port, planner_port = free_port(), free_port()
    config = log_dir / "planner.json"
    config.write_text(json.dumps(planner_config(args, frontend_port, settings, least, most)))
    processes = Processes(log_dir)
    run = Run(name, least=least, tail_s=args.tail_seconds if least < most else 0.0)
    try:
        if args.backend == "etcd":
            # etcd discovery, NATS request and event planes, on servers of this run alone.
            env.update({"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": start_etcd(processes, log_dir),
                        "NATS_SERVER": start_nats(processes, log_dir), "DYN_REQUEST_PLANE": "nats",
                        "DYN_EVENT_PLANE": "nats"})
            env.pop("DYN_FILE_KV")
        processes.start("frontend", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-host", "127.0.0.1",
                                     "--http-port", str(frontend_port)], env)
        processes.start("planner", [sys.executable, "-m", "dynamo.planner", "--config", str(config),
                                    "--port", str(planner_port)], env)
        wait_for_models(frontend_port, [MODEL], processes, timeout=120)
        wait_until(f"{least} ready replicas", lambda: planner_fleet(planner_port) >= least, processes, 120)
        print(f"  {name}: {len(offsets)} requests over {offsets[-1]:.0f}s, replicas {least}..{most}", flush=True)
        asyncio.run(drive(frontend_port, planner_port, offsets, run))
    finally:
        processes.stop(grace=40)
    planner_log = (log_dir / "planner.log").read_text(errors="replace")
    run.urgent_ups = sum("urgent loop: agg up" in line for line in planner_log.splitlines())
    return run


def figures(run: Run, args: argparse.Namespace) -> dict[str, Any]:
    records = run.records
    ttft_s, gap_s = args.ttft_ms / 1000.0, args.itl_ms / 1000.0
    within = [r for r in records if r.ok and r.ttft <= ttft_s and r.gap <= gap_s]
    start, end = min(r.sent for r in records), max(r.ended for r in records)
    last_sent = max(r.sent for r in records)
    replica_seconds, previous = 0.0, None
    for t, replicas in run.fleet:
        if previous is not None:
            lo, hi = max(previous[0], start), min(t, end)
            if hi > lo:
                replica_seconds += previous[1] * (hi - lo)
        previous = (t, replicas)
    if previous is not None and end > previous[0]:
        replica_seconds += previous[1] * (end - max(previous[0], start))
    gpu_hours = replica_seconds / 3600.0  # one GPU per replica
    # The changes while requests ran: those of the tail after the last answer are not the
    # workload's (as in the planner lab).
    during = [(t, n) for t, n in run.fleet if t <= end]
    sizes = [n for _, n in during]
    changes = [b - a for a, b in itertools.pairwise(sizes) if b != a]
    downs = [t for (_, a), (t, b) in itertools.pairwise(during) if b < a]
    failed = [r for r in records if not r.ok]
    failed_at_down = [r for r in failed if any(r.sent <= t <= r.ended for t in downs)]

    def broken_bins(since: float) -> list[bool]:
        """Whether each ``BIN_S`` bin of the requests sent from ``since`` on broke a target."""
        bins: dict[int, list[Record]] = {}
        for r in records:
            if r.sent >= since:
                bins.setdefault(int((r.sent - since) // BIN_S), []).append(r)
        return [
            bool(rs) and (percentile([r.ttft for r in rs], 90) > ttft_s or percentile([r.gap for r in rs], 90) > gap_s)
            for rs in (bins.get(index, []) for index in range(max(bins) + 1 if bins else 0))
        ]

    step = step_at(args.workload, args.minutes * 60.0)
    first_up_s = None
    if step is None:
        longest = streak = 0
        for broken in broken_bins(start):
            streak = streak + 1 if broken else 0
            longest = max(longest, streak)
        recovery_s = longest * BIN_S
    else:
        recovery_s = first_broken_run_end(broken_bins(run.began + step)) * BIN_S
        # The fleet's first growth after the step: from its size at the step.
        at_step = [n for t, n in run.fleet if t <= run.began + step]
        grown = [t for t, n in run.fleet if t > run.began + step and at_step and n > at_step[-1]]
        first_up_s = grown[0] - (run.began + step) if grown else None
    back = next((t for t, n in run.fleet if t >= last_sent and n <= run.least), None)
    return {
        "config": run.config,
        "requests": len(records),
        "failed": len(failed),
        "sla_attainment": len(within) / len(records),
        "gpu_hours": gpu_hours,
        "goodput_per_gpu": len(within) / gpu_hours if gpu_hours > 0 else 0.0,
        "scale_events": len(changes),
        "reversals": count_reversals(changes),
        "failed_at_scale_down": len(failed_at_down),
        "recovery_s": recovery_s,
        "first_up_s": first_up_s,
        "urgent_ups": run.urgent_ups,
        "to_min_s": None if back is None or not run.tail_s else back - last_sent,
        "peak_replicas": max(sizes, default=0),
        "ttft_p90_ms": percentile([r.ttft for r in records if r.ok], 90) * 1000,
        "itl_p90_ms": percentile([r.gap for r in records if r.ok], 90) * 1000,
    }


COLUMNS = [("config", "{}"), ("requests", "{}"), ("failed", "{}"), ("sla_attainment", "{:.3f}"),
           ("gpu_hours", "{:.4f}"), ("goodput_per_gpu", "{:.0f}"), ("scale_events", "{}"), ("reversals", "{}"),
           ("failed_at_scale_down", "{}"), ("recovery_s", "{:.0f}"), ("first_up_s", "{:.1f}"), ("urgent_ups", "{}"),
           ("to_min_s", "{:.1f}"), ("peak_replicas", "{}"),
           ("ttft_p90_ms", "{:.0f}"), ("itl_p90_ms", "{:.0f}")]


def table(rows: list[dict[str, Any]]) -> str:
    head = "| " + " | ".join(name for name, _ in COLUMNS) + " |"
    rule = "|" + "|".join("---" for _ in COLUMNS) + "|"
    lines = [
        "| " + " | ".join("-" if row[name] is None else fmt.format(row[name]) for name, fmt in COLUMNS) + " |"
        for row in rows
    ]
    return "\n".join([head, rule, *lines])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="ramp",
                        help="ramp (40 %% rise, 20 %% at the peak, 40 %% fall; default) or step (thirds at base, "
                        "peak, base)")
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the workload (default 5)")
    parser.add_argument("--base-rate", type=float, default=2.0, help="req/s at the start and end (default 2)")
    parser.add_argument("--peak-rate", type=float, default=20.0, help="req/s at the peak (default 20)")
    parser.add_argument("--ttft-ms", type=float, default=500.0, help="p90 TTFT target (default 500)")
    parser.add_argument("--itl-ms", type=float, default=100.0, help="p90 inter-token gap target (default 100)")
    parser.add_argument("--max-replicas", type=int, default=8, help="the planner's max replicas (default 8)")
    parser.add_argument("--static-replicas", type=int,
                        help="size of the static fleet (default: the most replicas the planner held)")
    parser.add_argument("--load-interval", type=float, default=2.0, help="the planner's load loop (s, default 2)")
    parser.add_argument("--urgent-interval", type=lambda v: None if v == "off" else float(v), default=1.0,
                        help="the planner's urgent check (s, default 1; off: none)")
    parser.add_argument("--startup-delay", type=float, default=0.0, help="held back before each worker start (s)")
    parser.add_argument("--backend", choices=["embedded", "etcd"], default="embedded",
                        help="embedded (file discovery, TCP planes; default) or etcd (etcd discovery, NATS planes; "
                        "starts its own etcd and nats-server)")
    parser.add_argument("--profile", type=Path,
                        help="a profile of one mocker worker (python -m dynamo.planner.profile); default none: "
                        "the load loop sizes alone")
    parser.add_argument("--tail-seconds", type=float, default=60.0,
                        help="after the last answer, how long the planner's fleet is watched for it to get back to "
                        "its minimum (to_min_s; default 60)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=["planner", "static-peak"], help="run one configuration")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--log-dir", type=Path, help="children's logs (default: a temporary folder)")
    args = parser.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-planner-"))
    offsets = arrivals(args.workload, args.minutes * 60.0, args.base_rate, args.peak_rate, args.seed)
    print(f"{args.workload} {args.base_rate:g} -> {args.peak_rate:g} -> {args.base_rate:g} req/s over "
          f"{args.minutes:g} min, urgent check {args.urgent_interval or 'off'}; "
          f"logs in {log_dir}", flush=True)
    rows = []
    static = args.static_replicas
    if args.only != "static-peak":
        run = run_config("planner", args, log_dir / "planner", 1, args.max_replicas, offsets)
        rows.append(figures(run, args))
        static = static or rows[-1]["peak_replicas"]
    if args.only != "planner":
        if not static:
            parser.error("--only static-peak needs --static-replicas")
        run = run_config("static-peak", args, log_dir / "static", static, static, offsets)
        rows.append(figures(run, args))
    if len(rows) == 2 and rows[1]["goodput_per_gpu"] > 0:
        rows[0]["goodput_vs_static"] = rows[0]["goodput_per_gpu"] / rows[1]["goodput_per_gpu"]
    print(table(rows))
    if "goodput_vs_static" in rows[0]:
        print(f"goodput per GPU, planner / static-peak: {rows[0]['goodput_vs_static']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

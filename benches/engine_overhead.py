"""What serving a real engine through Dynamo costs: vLLM's own OpenAI server against our
frontend + ``python -m dynamo.vllm`` on the same tiny model, the same open-loop load, in
one run.

    python benches/engine_overhead.py                                  # every config (minutes)
    python benches/engine_overhead.py --requests 48 --rates 2,4,8,16,inf --json /tmp/eo.json
    python benches/engine_overhead.py --configs vllm,embedded --rates 4,inf --model /tmp/tiny-llama

Configurations (``--configs``, all started here on free loopback ports):

* ``vllm``: ``python -m vllm.entrypoints.openai.api_server`` alone (its access log off).
* ``embedded``: ``dynamo-run in=http out=dyn`` + one ``python -m dynamo.vllm`` worker on
  the embedded default (file discovery, TCP request/event planes).
* ``etcd_nats``: the same on etcd + NATS (``etcd`` and ``nats-server -js`` started here).
* ``rr`` and ``kv``: two ``python -m dynamo.vllm`` workers (embedded backend) behind two
  frontends, one ``--router-mode round-robin``, one ``--router-mode kv``, measured one
  after the other on the shared-prefix workload (below), each rate with conversations of
  its own so neither finds the other's prefixes cached.

``vllm``, ``embedded`` and ``etcd_nats`` are started together (each ready before the
next starts; an idle engine costs ~1 % of a core) and measured in turn at each rate, so
that load from elsewhere on the machine, which comes and goes, falls on all of them
alike (``--one-at-a-time``: start, measure, stop each in turn); ``--repeat N`` runs each
N times per rate, the order rotated, samples pooled. Then the ``rr``/``kv`` fleet.

Every engine runs with the real-engine tier's vLLM flags for this CPU
(``--kv-cache-memory-bytes 256M --enforce-eager --max-model-len 1024 --max-num-seqs 64
--block-size 32``). The model is ``python -m dynamo.llm.tiny_model`` (made in a temp dir
unless ``--model DIR``): a random-weight 2-layer Llama whose EOS logit is held at 0, so
greedy answers run to ``max_tokens``; ``ignore_eos`` is set too (vLLM's field, our
``nvext.ignore_eos``).

Load: for each rate of ``--rates`` (requests/s, ``inf``: all at once), ``--requests``
streaming completions sent at Poisson arrival times (seeded: the same times and
prompts for every configuration), open loop (a request is sent at its time whatever
the others are doing). Each request is ``--prompt-tokens`` random token ids (a BOS and
ids outside the specials and byte tokens, unique per request so the prefix cache finds
nothing) and ``max_tokens: --output-tokens``, ``temperature: 0``. The shared-prefix
workload (``rr``/``kv``): ``--conversations`` prefixes of ``--prefix-tokens`` tokens,
each request one of them plus ``--prompt-tokens`` tokens of its own, in shuffled order.
Before each configuration's first rate, a few requests warm it up (not measured).

Measured per configuration and rate: requests/s and output tokens/s (completed streams
and their ``usage.completion_tokens`` over the time from the first send to the last
end), TTFT (send to first event with text) and ITL (gaps between events with text)
p50/p99, TPOT p50 (per request: first to last event with text over the tokens after the
first; unlike ITL, not lowered when several events arrive in one read) and output tokens
per event (above 1 when a server merges tokens into one event). Then the issue's targets: our throughput at saturation (the ``inf`` rate) over
vLLM's, our TTFT p50 and ITL p50 minus vLLM's at half load (the finite rate nearest half
of vLLM's saturated requests/s), and KV routing's TTFT p50 against round-robin's.

Children start in their own process groups and are stopped (SIGTERM, then SIGKILL to the
group) after each configuration, also on failure; they die with this process
(PR_SET_PDEATHSIG). Engines must be ready within ``--start-timeout``; the whole run is
bounded by ``--timeout``. Engines of other processes on the machine are reported, since
they share its cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_load import (
    OpenLoopResult,
    Processes,
    free_port,
    listed_models,
    open_loop,
    run_async,
    start_etcd,
    start_nats,
    wait_until,
)

DYNAMO_RUN = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()"]
MODEL = "tiny-llama"
#: vLLM flags for this CPU (as tests/engines/engine_fleet.py).
ENGINE_FLAGS = [
    "--kv-cache-memory-bytes", "256M", "--enforce-eager", "--max-model-len", "1024", "--max-num-seqs", "64",
    "--block-size", "32",
]
CONFIGS = ["vllm", "embedded", "etcd_nats", "rr", "kv"]
#: Token ids a prompt draws from: above the 3 specials and 256 byte tokens of the tiny
#: model's 2,048-token vocabulary.
FIRST_ID, VOCAB = 259, 2048
BOS = 1
WARMUP_REQUESTS = 8


# ----------------------------------------------------------------------------- workloads


def completion_body(prompt: list[int], output_tokens: int, target: str) -> bytes:
    body: dict[str, Any] = {
        "model": MODEL, "prompt": prompt, "max_tokens": output_tokens, "temperature": 0.0, "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target == "vllm":
        body["ignore_eos"] = True
    else:
        body["nvext"] = {"ignore_eos": True}
    return json.dumps(body).encode()


def unique_prompts(count: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[BOS] + [rng.randrange(FIRST_ID, VOCAB) for _ in range(length - 1)] for _ in range(count)]


def prefix_prompts(count: int, conversations: int, prefix: int, own: int, seed: int) -> list[list[int]]:
    """`count` prompts: one of `conversations` shared prefixes of `prefix` tokens plus
    `own` tokens of their own, shuffled."""
    rng = random.Random(seed)
    prefixes = [[BOS] + [rng.randrange(FIRST_ID, VOCAB) for _ in range(prefix - 1)] for _ in range(conversations)]
    prompts = [prefixes[i % conversations] + [rng.randrange(FIRST_ID, VOCAB) for _ in range(own)]
               for i in range(count)]
    rng.shuffle(prompts)
    return prompts


# ----------------------------------------------------------------------------- servers


def engine_env(base: dict[str, str]) -> dict[str, str]:
    return {**base, "VLLM_LOGGING_LEVEL": "WARNING", "VLLM_NO_USAGE_STATS": "1", "TOKENIZERS_PARALLELISM": "false"}


def plain_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DYN_") and k not in ("ETCD_ENDPOINTS", "NATS_SERVER")}
    env["DYN_LOG"] = os.environ.get("DYN_LOG", "warn")
    return env


def backend_env(backend: str, processes: Processes, base: Path) -> dict[str, str]:
    env = {**plain_env(), "DYN_TCP_HOST": "127.0.0.1"}
    base.mkdir(parents=True, exist_ok=True)
    if backend == "embedded":
        kv = base / f"kv-{uuid.uuid4().hex[:6]}"
        kv.mkdir()
        env.update({"DYN_DISCOVERY_BACKEND": "file", "DYN_FILE_KV": str(kv), "DYN_REQUEST_PLANE": "tcp",
                    "DYN_EVENT_PLANE": "tcp"})
    else:
        env.update({"DYN_DISCOVERY_BACKEND": "etcd", "ETCD_ENDPOINTS": start_etcd(processes, base),
                    "NATS_SERVER": start_nats(processes, base), "DYN_REQUEST_PLANE": "nats",
                    "DYN_EVENT_PLANE": "nats"})
    return env


def start_vllm_server(processes: Processes, model: Path, timeout: float) -> int:
    port = free_port()
    processes.start("vllm-server", [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--disable-uvicorn-access-log",
        *ENGINE_FLAGS,
    ], engine_env(plain_env()))
    wait_until("vLLM's server", lambda: MODEL in listed_models(port), processes, timeout)
    return port


async def instance_count(env: dict[str, str], endpoint: str) -> int:
    from dynamo.runtime import DistributedRuntime

    os.environ.update({k: v for k, v in env.items() if k.startswith("DYN_") or k in ("ETCD_ENDPOINTS", "NATS_SERVER")})
    runtime = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        client = await runtime.endpoint(endpoint).client()
        await asyncio.sleep(0.5)
        return len(client.instance_ids())
    finally:
        await runtime.shutdown()


def start_fleet(processes: Processes, env: dict[str, str], model: Path, workers: int, router_modes: list[str],
                timeout: float, tag: str) -> list[int]:
    """`workers` ``python -m dynamo.vllm`` workers and one frontend per router mode, all
    ready (every worker registered, the model listed); the frontends' ports."""
    namespace = f"eo{uuid.uuid4().hex[:8]}"
    endpoint = f"{namespace}.backend.generate"
    for i in range(workers):
        processes.start(f"{tag}-worker-{i}", [
            sys.executable, "-m", "dynamo.vllm", "--model", str(model), "--served-model-name", MODEL,
            "--endpoint", f"dyn://{endpoint}", *ENGINE_FLAGS,
        ], engine_env(env))
    ports = []
    for mode in router_modes:
        port = free_port()
        processes.start(f"{tag}-frontend-{mode}", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port),
                                             "--namespace", namespace, "--router-mode", mode], env)
        ports.append(port)
    for port in ports:
        wait_until(f"the frontend on {port}", lambda p=port: MODEL in listed_models(p), processes, timeout)
    deadline = time.monotonic() + timeout
    while (n := run_async(instance_count(env, endpoint))) < workers:
        processes.check()
        if time.monotonic() >= deadline:
            raise RuntimeError(f"{n} of {workers} workers registered within {timeout:.0f}s")
        time.sleep(0.5)
    return ports


def foreign_engines(ours: Processes) -> list[str]:
    """Engine processes on this machine that are not ours (they share the cores)."""
    mine = {p.pid for _, p in ours.started}
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            comm = (proc / "comm").read_text().strip()
            pgid = os.getpgid(int(proc.name))
        except (OSError, ProcessLookupError):
            continue
        if ("VLLM" in comm or "EngineCore" in comm) and pgid not in mine:
            found.append(f"{proc.name} {comm}")
    return found


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


# ----------------------------------------------------------------------------- running


@dataclass
class Served:
    """One measured thing: a configuration's HTTP port and the workload it gets."""

    name: str
    port: int
    #: ``unique`` (fixed-length prompts of their own) or ``prefix`` (shared prefixes).
    workload: str

    @property
    def body_kind(self) -> str:
        return "vllm" if self.name == "vllm" else "dynamo"


def fmt_rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


def report(config: str, r: OpenLoopResult) -> dict[str, Any]:
    s = r.summary()
    print(f"  {config:<10} @{fmt_rate(r.rate):>4}/s  {s['req_per_s']:6.2f} req/s {s['output_tok_per_s']:7.0f} tok/s   "
          f"TTFT p50 {s['ttft_p50_ms']:7.1f} p99 {s['ttft_p99_ms']:7.1f} ms   ITL p50 {s['itl_p50_ms']:6.2f} "
          f"p99 {s['itl_p99_ms']:6.2f} ms   TPOT p50 {s['tpot_p50_ms']:6.2f} ms   {s['tokens_per_event']:.2f} tok/event   "
          f"({r.completed} ok, {r.errors} errors, {r.seconds:.1f} s, load {load_average()})", flush=True)
    return {"config": config, **s}


def merge(into: OpenLoopResult | None, r: OpenLoopResult) -> OpenLoopResult:
    """Pool the samples of repeated runs at one rate."""
    if into is None:
        return r
    into.requests += r.requests
    into.completed += r.completed
    into.errors += r.errors
    into.seconds += r.seconds
    into.output_tokens += r.output_tokens
    into.events += r.events
    into.ttft += r.ttft
    into.gaps += r.gaps
    into.tpot += r.tpot
    into.first_error = into.first_error or r.first_error
    return into


def bodies(served: Served, rate_index: int, rep: int, args: argparse.Namespace) -> list[bytes]:
    """The requests of one run: the same prompts for every configuration of a workload
    at (rate, repeat); new ones for each (rate, repeat), so no run finds an earlier
    run's prompts in the prefix cache (prefix workload: also new ones per router)."""
    seed = args.seed + 100 * rep + rate_index
    if served.workload == "unique":
        prompts = unique_prompts(args.requests, args.prompt_tokens, seed)
    else:
        seed += 10_000 * (1 + ["rr", "kv"].index(served.name))
        prompts = prefix_prompts(args.requests, args.conversations, args.prefix_tokens, args.prompt_tokens, seed)
    return [completion_body(p, args.output_tokens, served.body_kind) for p in prompts]


def measure(served: list[Served], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every rate, lowest first; at each rate each of `served` in turn (the order
    rotated from repeat to repeat), so that load from elsewhere on the machine falls on
    all of them alike; repeats pooled."""
    rows = []
    for i, rate in enumerate(args.rates):
        pooled: dict[str, OpenLoopResult | None] = {s.name: None for s in served}
        for rep in range(args.repeat):
            for k in range(len(served)):
                s = served[(k + rep) % len(served)]
                result = run_async(open_loop(s.port, "/v1/completions", bodies(s, i, rep, args), rate,
                                             seed=args.seed + 100 * rep + i, timeout=args.request_timeout))
                pooled[s.name] = merge(pooled[s.name], result)
        for s in served:
            result = pooled[s.name]
            assert result is not None
            rows.append(report(s.name, result))
    return rows


def warm_up(served: Served, args: argparse.Namespace) -> None:
    prompts = unique_prompts(WARMUP_REQUESTS, args.prompt_tokens, seed=99_999)
    warm = [completion_body(p, args.output_tokens, served.body_kind) for p in prompts]
    run_async(open_loop(served.port, "/v1/completions", warm[:2], 1000.0, timeout=args.request_timeout))
    run_async(open_loop(served.port, "/v1/completions", warm[2:], float("inf"), timeout=args.request_timeout))


def start(name: str, processes: Processes, log_dir: Path, args: argparse.Namespace) -> list[Served]:
    """Start configuration `name` and wait until it is ready."""
    t0 = time.monotonic()
    if name == "vllm":
        served = [Served("vllm", start_vllm_server(processes, args.model, args.start_timeout), "unique")]
    elif name in ("embedded", "etcd_nats"):
        env = backend_env(name, processes, log_dir / name)
        port = start_fleet(processes, env, args.model, 1, ["round-robin"], args.start_timeout, name)[0]
        served = [Served(name, port, "unique")]
    else:
        env = backend_env("embedded", processes, log_dir / name)
        rr, kv = start_fleet(processes, env, args.model, 2, ["round-robin", "kv"], args.start_timeout, name)
        served = [Served("rr", rr, "prefix"), Served("kv", kv, "prefix")]
    print(f"  {name}: ready in {time.monotonic() - t0:.0f} s (load {load_average()})", flush=True)
    return served


def run_group(names: list[str], args: argparse.Namespace, log_root: Path) -> list[dict[str, Any]]:
    """Start the configurations `names` (one after the other, each ready before the
    next starts), warm each up, measure them together, stop them all (also on failure)."""
    group = "+".join(names)
    log_dir = log_root / group
    log_dir.mkdir(parents=True, exist_ok=True)
    processes = Processes(log_dir)
    started = time.monotonic()
    print(f"{group}:", flush=True)
    try:
        others = foreign_engines(processes)
        if others:
            print(f"  note: {len(others)} engine processes of others share the machine: {', '.join(others)}",
                  flush=True)
        served = [s for name in names for s in start(name, processes, log_dir, args)]
        for s in served:
            warm_up(s, args)
        return measure(served, args)
    except BaseException:
        print(f"  {group} failed; logs in {log_dir}", file=sys.stderr, flush=True)
        raise
    finally:
        processes.stop()
        print(f"  ({group}: {time.monotonic() - started:.0f} s with start and stop)", flush=True)


# ----------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| config | rate (req/s) | req/s | output tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | TPOT p50 ms | tok/event | ok / errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['config']} | {fmt_rate(r['rate'])} | {r['req_per_s']:.2f} | {r['output_tok_per_s']:.0f} | "
            f"{r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | {r['itl_p50_ms']:.2f} | {r['itl_p99_ms']:.2f} | "
            f"{r['tpot_p50_ms']:.2f} | {r['tokens_per_event']:.2f} | "
            f"{r['completed']} / {r['errors']} |")
    return "\n".join(lines)


def find(rows: list[dict[str, Any]], config: str, rate: float) -> dict[str, Any] | None:
    return next((r for r in rows if r["config"] == config and r["rate"] == rate), None)


def targets(rows: list[dict[str, Any]], rates: list[float]) -> list[str]:
    out = []
    finite = [r for r in rates if not math.isinf(r)]
    sat = find(rows, "vllm", math.inf)
    half = None
    if sat is not None and finite:
        half = min(finite, key=lambda r: abs(r - sat["req_per_s"] / 2))
        out.append(f"saturation: the inf rate (vLLM {sat['req_per_s']:.2f} req/s); half load: {fmt_rate(half)} req/s "
                   f"(the rate nearest half of that)")
    for ours in ("embedded", "etcd_nats"):
        mine = find(rows, ours, math.inf)
        if sat is not None and mine is not None:
            ratio = mine["req_per_s"] / sat["req_per_s"]
            tok = mine["output_tok_per_s"] / sat["output_tok_per_s"]
            out.append(f"{ours}: throughput at saturation / vLLM's = {ratio:.1%} req/s, {tok:.1%} tok/s "
                       f"(target ≥ 97 %): {'met' if ratio >= 0.97 else 'MISSED'}")
        if half is not None:
            a, b = find(rows, ours, half), find(rows, "vllm", half)
            if a is not None and b is not None:
                d_ttft = a["ttft_p50_ms"] - b["ttft_p50_ms"]
                d_itl = a["itl_p50_ms"] - b["itl_p50_ms"]
                out.append(f"{ours}: TTFT p50 − vLLM's at {fmt_rate(half)} req/s = {d_ttft:+.2f} ms (target ≤ 2 ms): "
                           f"{'met' if d_ttft <= 2 else 'MISSED'}")
                out.append(f"{ours}: ITL p50 − vLLM's at {fmt_rate(half)} req/s = {d_itl:+.3f} ms (target ≤ 0.5 ms): "
                           f"{'met' if d_itl <= 0.5 else 'MISSED'} (TPOT p50 − vLLM's: "
                           f"{a['tpot_p50_ms'] - b['tpot_p50_ms']:+.3f} ms, not a target)"
                           + (" — both ITL p50 ≈ 0: tokens arrive in bursts, so this comparison says little"
                              if max(a["itl_p50_ms"], b["itl_p50_ms"]) < 0.05 else ""))
    for ours in ("embedded", "etcd_nats"):
        deltas = []
        for rate in finite:
            a, b = find(rows, ours, rate), find(rows, "vllm", rate)
            if a is not None and b is not None:
                deltas.append(f"{fmt_rate(rate)}/s {a['ttft_p50_ms'] - b['ttft_p50_ms']:+.1f} / "
                              f"{a['itl_p50_ms'] - b['itl_p50_ms']:+.2f} / {a['tpot_p50_ms'] - b['tpot_p50_ms']:+.2f}")
        if deltas:
            out.append(f"{ours} − vLLM at every rate, TTFT p50 / ITL p50 / TPOT p50 (ms): {'; '.join(deltas)}")
    for rate in rates:
        kv, rr = find(rows, "kv", rate), find(rows, "rr", rate)
        if kv is not None and rr is not None:
            better = kv["ttft_p50_ms"] < rr["ttft_p50_ms"]
            out.append(f"kv vs round-robin at {fmt_rate(rate)} req/s: TTFT p50 {kv['ttft_p50_ms']:.1f} vs "
                       f"{rr['ttft_p50_ms']:.1f} ms (ratio {kv['ttft_p50_ms'] / rr['ttft_p50_ms']:.2f}; target: KV "
                       f"lower): {'met' if better else 'MISSED'}")
    return out


def make_model(root: Path) -> Path:
    model = root / "tiny-llama"
    subprocess.run([sys.executable, "-m", "dynamo.llm.tiny_model", str(model)], check=True, timeout=180,
                   stdout=subprocess.DEVNULL)
    return model


def on_timeout(signum: int, frame: Any) -> None:
    raise TimeoutError("the benchmark ran longer than --timeout")


def parse_rates(text: str) -> list[float]:
    return [float("inf") if x.strip() in ("inf", "max") else float(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS),
                        help=f"comma-separated, of {', '.join(CONFIGS)} (rr and kv share their workers; default: all)")
    parser.add_argument("--rates", type=parse_rates, default=parse_rates("2,4,8,16,inf"),
                        help="comma-separated request rates (req/s), inf: all at once (default 2,4,8,16,inf)")
    parser.add_argument("--requests", type=int, default=48, help="requests per rate and repeat (default 48)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per configuration and rate, interleaved with the other configurations' and "
                             "pooled (default 1)")
    parser.add_argument("--one-at-a-time", dest="together", action="store_false",
                        help="start, measure and stop vllm, embedded and etcd_nats one after the other instead "
                             "of starting them together and measuring them in turn at each rate")
    parser.add_argument("--prompt-tokens", type=int, default=128,
                        help="prompt tokens (shared-prefix workload: tokens after the prefix) (default 128)")
    parser.add_argument("--output-tokens", type=int, default=64, help="max_tokens, generated in full (default 64)")
    parser.add_argument("--conversations", type=int, default=6, help="shared prefixes (rr/kv; default 6)")
    parser.add_argument("--prefix-tokens", type=int, default=640, help="tokens of a shared prefix (default 640)")
    parser.add_argument("--model", type=Path, help="a model folder (default: python -m dynamo.llm.tiny_model in a temp dir)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--log-dir", type=Path, help="keep the processes' logs here (default: a temp dir)")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="bound on a configuration's start (s)")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="bound on one request (s)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    args = parser.parse_args()
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}; known: {CONFIGS}")
    single = [c for c in configs if c in ("vllm", "embedded", "etcd_nats")]
    groups = [single] if args.together and single else [[c] for c in single]
    if "rr" in configs or "kv" in configs:  # one fleet serves both
        groups.append(["rr+kv"])

    signal.signal(signal.SIGALRM, on_timeout)
    signal.alarm(int(args.timeout))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    rows: list[dict[str, Any]] = []
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="engine-overhead-") as tmp:
        log_root = args.log_dir or Path(tmp)
        if args.model is None:
            args.model = make_model(Path(tmp))
        print(f"{args.requests} requests per rate and repeat, {args.repeat} repeats, rates {','.join(fmt_rate(r) for r in args.rates)}, prompts of "
              f"{args.prompt_tokens} tokens, {args.output_tokens} output tokens; shared-prefix workload: "
              f"{args.conversations} prefixes of {args.prefix_tokens} tokens; model {args.model}; "
              f"{os.cpu_count()} CPUs, load {load_average()}", flush=True)
        for group in groups:
            rows += run_group(group, args, log_root)
    signal.alarm(0)
    print()
    print(table(rows))
    print()
    for line in targets(rows, args.rates):
        print(line)
    print(f"\n({time.time() - started:.0f} s in all)")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

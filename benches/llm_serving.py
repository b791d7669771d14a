"""LLM serving benchmark: streaming chat requests against the OpenAI frontend.

    python benches/llm_serving.py                       # both scenarios (about 2 minutes)
    python benches/llm_serving.py --scenario echo --duration 5
    python benches/llm_serving.py --scenario mocker --requests 640 --model-path DIR
    python benches/llm_serving.py --scenario mocker --speedup-ratio 1000   # engine time ~0: the stack's share
    python benches/llm_serving.py --client-procs 2 --json /tmp/llm.json
    python benches/llm_serving.py --scenario mocker --router-mode approx   # kv | approx | round-robin | random
    python benches/llm_serving.py --scenario tools --concurrency 64 --duration 10

Scenarios (the processes are started here, on free loopback ports):

* ``echo``: ``dynamo-run in=http out=echo_full`` with ``DYN_TOKEN_ECHO_DELAY_MS=0``: the
  frontend's own cost. Each client loops a streaming chat request whose message is two
  characters (so a 4-event stream: 2 characters, the stop chunk, ``[DONE]``) for
  ``--duration`` seconds.
* ``tools``: ``dynamo-run in=http out=echo_core --tool-call-parser hermes`` (byte-level
  card, one token per byte, ``DYN_TOKEN_ECHO_DELAY_MS=0``): each streaming request's raw
  prompt (``nvext.use_raw_prompt``) is echoed back as the "model output": a sentence and
  a ``<tool_call>`` of about 200 bytes (``call``), then plain prose of the same bytes
  (``prose``; the bench checks that both variants report the same output tokens). Each
  is measured with ``tools`` (the output goes through the tool-call parser: for ``call``
  one call, finish ``tool_calls``; for ``prose`` no call, the same content events),
  without, and with ``tools`` and ``tool_choice: none`` (the request side's cost, no
  parser), ``--repeats`` times per level with the variants' order alternating: the
  median and spread of the frontend CPU per request of each, and of the per-repeat
  ratio with tools / without.
* ``mocker``: ``dynamo-run in=http out=dyn`` in front of ``python -m dynamo.mocker
  --num-workers 2`` (``num_gpu_blocks: 640`` each, the mocker's default timing model, its
  tokenizer from ``--model-path``), embedded backend (file discovery, TCP planes). The
  workload has 16 system prompts of about 1,000 tokens shared as prefixes; each request is
  one of them plus a short user question, ``max_tokens: 32``. ``--requests`` requests in
  all per concurrency level; the workers keep their caches from level to level. After
  each level, each worker's prefix-cache hit rate (from its load metrics) is printed.
  ``--router-mode`` picks the frontend's router: ``round-robin`` (default), ``random``,
  ``kv`` (KV events followed) or ``approx`` (``--router-mode kv --no-kv-events``: caches
  predicted from the router's own choices).

The clients are asyncio tasks, each with one keep-alive HTTP/1.1 connection and a
minimal HTTP/SSE reader (uvloop when installed), in this process or split over
``--client-procs`` processes. Measured: requests/s
(completed streams over the wall time), time to first token (the first event with
content) p50/p99, and inter-token latency (gaps between content events) p50/p99.

The processes log to a temp directory (shown on failure); all of them are killed on exit
and die with this process (PR_SET_PDEATHSIG). The whole run is bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from serving_load import (
    Connection,
    Processes,
    Sample,
    free_port,
    percentile,
    run_async,
    wait_for_models,
)

__all__ = ["Connection", "Processes", "Sample", "free_port", "percentile", "run_async", "wait_for_models"]

HERE = Path(__file__).resolve()
REPO_ROOT = HERE.parent.parent
DEFAULT_MODEL_PATH = REPO_ROOT.parent / "shared" / "models" / "tinyllama-chat"
DYNAMO_RUN = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()"]

#: `--router-mode` of this script → the frontend's router flags.
ROUTER_MODES = {
    "round-robin": ["--router-mode", "round-robin"],
    "random": ["--router-mode", "random"],
    "kv": ["--router-mode", "kv"],
    "approx": ["--router-mode", "kv", "--no-kv-events"],
}

SYSTEM_PROMPTS = 16
#: Words per system prompt: about 1,000 tokens with a Llama tokenizer.
SYSTEM_PROMPT_WORDS = 940
MAX_TOKENS = 32
NUM_GPU_BLOCKS = 640
STARTUP_TIMEOUT = 60.0
REQUEST_TIMEOUT = 60.0

WORDS = str.split(
    "the of and to in is was for on that with as by at from his her an were which are this be "
    "system model cache token prefix routing worker engine request latency memory block stream "
    "river mountain garden window silver orange planet music letter forest island market "
    "quickly slowly carefully brightly quietly simply rarely often always never"
)


@dataclass
class Result:
    """The figures of one concurrency level."""

    scenario: str
    concurrency: int
    completed: int
    errors: int
    seconds: float
    ttft: list[float] = field(default_factory=list)
    gaps: list[float] = field(default_factory=list)
    #: CPU time the frontend process used per completed request (µs), when measured.
    frontend_cpu_us: float | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "frontend_cpu_us_per_req": self.frontend_cpu_us,
            "scenario": self.scenario,
            "concurrency": self.concurrency,
            "completed": self.completed,
            "errors": self.errors,
            "req_per_s": self.completed / self.seconds,
            "ttft_p50_ms": percentile(self.ttft, 50) * 1000,
            "ttft_p99_ms": percentile(self.ttft, 99) * 1000,
            "itl_p50_ms": percentile(self.gaps, 50) * 1000,
            "itl_p99_ms": percentile(self.gaps, 99) * 1000,
        }


async def run_level(
    scenario: str, port: int, concurrency: int, bodies: list[bytes], *, duration: float | None, requests: int | None
) -> Result:
    """`concurrency` clients sending `bodies` in turn, for `duration` seconds or until
    `requests` requests have been sent."""
    result = Result(scenario, concurrency, 0, 0, 0.0)
    issued = 0
    first_error: list[str] = []

    async def client(index: int) -> None:
        nonlocal issued
        conn = Connection(port)
        try:
            while True:
                if requests is not None:
                    if issued >= requests:
                        return
                elif time.perf_counter() >= end:
                    return
                body = bodies[issued % len(bodies)]
                issued += 1
                try:
                    sample = await asyncio.wait_for(conn.chat(body), REQUEST_TIMEOUT)
                except (OSError, RuntimeError, ValueError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
                    result.errors += 1
                    if not first_error:
                        first_error.append(repr(e))
                    await conn.close()
                    continue
                result.completed += 1
                result.ttft.append(sample.ttft)
                result.gaps.extend(sample.gaps)
        finally:
            await conn.close()

    start = time.perf_counter()
    end = start + (duration or 0.0)
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    result.seconds = time.perf_counter() - start
    if first_error:
        print(f"  first error: {first_error[0]}", file=sys.stderr)
    return result


def _level_in_process(job: tuple[str, int, int, list[bytes], float | None, int | None]) -> Result:
    scenario, port, concurrency, bodies, duration, requests = job
    return run_async(run_level(scenario, port, concurrency, bodies, duration=duration, requests=requests))


def measure(
    scenario: str, port: int, concurrency: int, bodies: list[bytes], *, duration: float | None,
    requests: int | None, client_procs: int,
) -> Result:
    """One level, its clients split over `client_procs` processes (one Python process
    cannot drive the frontend at full speed)."""
    procs = max(1, min(client_procs, concurrency))
    if procs == 1:
        return _level_in_process((scenario, port, concurrency, bodies, duration, requests))
    jobs = []
    for i in range(procs):
        share = concurrency // procs + (1 if i < concurrency % procs else 0)
        quota = None if requests is None else requests // procs + (1 if i < requests % procs else 0)
        jobs.append((scenario, port, share, bodies[i::procs] or bodies, duration, quota))
    with ProcessPoolExecutor(procs, mp_context=multiprocessing.get_context("spawn")) as pool:
        parts = list(pool.map(_level_in_process, jobs))
    merged = Result(scenario, concurrency, 0, 0, max(p.seconds for p in parts))
    for part in parts:
        merged.completed += part.completed
        merged.errors += part.errors
        merged.ttft += part.ttft
        merged.gaps += part.gaps
    return merged


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_with_cpu(pid: int, *args: Any, **kwargs: Any) -> Result:
    """`measure`, plus the CPU time process `pid` (the frontend) spent per request: less
    sensitive to other load on the machine than req/s."""
    before = cpu_seconds(pid)
    result = measure(*args, **kwargs)
    if result.completed:
        result.frontend_cpu_us = (cpu_seconds(pid) - before) / result.completed * 1e6
    return result


# ----------------------------------------------------------------------------- scenarios


def base_env(log_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYN_")}
    kv = log_dir / "kv"
    kv.mkdir(exist_ok=True)
    env.update({
        "DYN_LOG": os.environ.get("DYN_LOG", "warn"),
        "DYN_DISCOVERY_BACKEND": "file",
        "DYN_FILE_KV": str(kv),
        "DYN_REQUEST_PLANE": "tcp",
        "DYN_EVENT_PLANE": "tcp",
        "DYN_TCP_HOST": "127.0.0.1",
    })
    return env


def echo_scenario(args: argparse.Namespace, log_dir: Path) -> list[Result]:
    processes = Processes(log_dir)
    port = free_port()
    env = {**base_env(log_dir), "DYN_TOKEN_ECHO_DELAY_MS": "0"}
    try:
        frontend = processes.start("frontend-echo", [*DYNAMO_RUN, "in=http", "out=echo_full", "--http-port",
                                                     str(port), "--model-name", "echo"], env)
        wait_for_models(port, ["echo"], processes)
        bodies = [json.dumps({"model": "echo", "messages": [{"role": "user", "content": "hi"}],
                              "stream": True}).encode()]
        measure("echo", port, 8, bodies, duration=1.0, requests=None, client_procs=1)  # warm-up
        results = []
        for concurrency in args.concurrency:
            result = measure_with_cpu(frontend.pid, "echo", port, concurrency, bodies, duration=args.duration,
                                      requests=None, client_procs=args.client_procs)
            report(result)
            results.append(result)
        return results
    finally:
        processes.stop()


TOOLS_OUTPUT = (
    "Let me look that up for you."
    '<tool_call>{"name": "get_weather", "arguments": {"city": "San Francisco", "unit": "celsius", '
    '"days": 3, "details": {"wind": true, "humidity": true, "note": "a \\"quoted\\" note, ünïcode"}}}</tool_call>'
)
#: Plain prose of the same length in bytes (so the same tokens on the byte-level card):
#: with `tools`, the parser reads it all and finds no call, so the stream is the same
#: content events as without; the parser's cost on the hot path, undiluted.
PLAIN_OUTPUT = ("The weather in San Francisco is mild today, with some wind and a little humidity. " * 4)[
    : len(TOOLS_OUTPUT.encode())
]
WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def completion_tokens(port: int, body: dict[str, Any]) -> int:
    """The output tokens of one streamed request (`stream_options.include_usage`)."""
    payload = json.dumps({**body, "stream_options": {"include_usage": True}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=payload,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        lines = response.read().decode().splitlines()
    for line in lines:
        if line.startswith("data: {") and json.loads(line[6:]).get("usage"):
            return int(json.loads(line[6:])["usage"]["completion_tokens"])
    raise RuntimeError(f"no usage in the response: {lines[-3:]!r}")


def tools_scenario(args: argparse.Namespace, log_dir: Path) -> list[Result]:
    """Frontend CPU per request with and without `tools`, for two outputs of the same
    tokens: a call (`call`) and plain prose (`prose`). Each (output, level) is measured
    `--repeats` times, the variants alternating, and reported as the median and the
    spread (min-max) of the CPU per request and of the per-repeat ratio."""
    processes = Processes(log_dir)
    port = free_port()
    env = {**base_env(log_dir), "DYN_TOKEN_ECHO_DELAY_MS": "0"}
    try:
        frontend = processes.start("frontend-tools", [*DYNAMO_RUN, "in=http", "out=echo_core", "--http-port",
                                                      str(port), "--model-name", "bytes", "--tool-call-parser",
                                                      "hermes"], env)
        wait_for_models(port, ["bytes"], processes)
        results = []
        for output_name, output in [("call", TOOLS_OUTPUT), ("prose", PLAIN_OUTPUT)]:
            plain = {"model": "bytes", "messages": [{"role": "user", "content": output}], "stream": True,
                     "nvext": {"use_raw_prompt": True}}
            with_tools = {**plain, "tools": [WEATHER_TOOL]}
            tokens = (completion_tokens(port, plain), completion_tokens(port, with_tools))
            if tokens[0] != tokens[1]:
                raise RuntimeError(f"{output_name}: {tokens[0]} output tokens without tools, {tokens[1]} with")
            print(f"  output {output_name!r}: {tokens[0]} tokens either way", flush=True)
            # `tool_choice: none`: the same body as with tools, no parser: the request side's share.
            no_choice = {**with_tools, "tool_choice": "none"}
            variants = [("no tools", [json.dumps(plain).encode()]), ("tools", [json.dumps(with_tools).encode()]),
                        ("tools, choice none", [json.dumps(no_choice).encode()])]
            for _, bodies in variants:
                measure("tools", port, 8, bodies, duration=1.0, requests=None, client_procs=1)  # warm-up
            for concurrency in args.concurrency:
                cpu: dict[str, list[float]] = {name: [] for name, _ in variants}
                for repeat in range(args.repeats):
                    order = variants if repeat % 2 == 0 else variants[::-1]
                    for name, bodies in order:
                        result = measure_with_cpu(frontend.pid, f"tools/{output_name} ({name})", port, concurrency,
                                                  bodies, duration=args.duration, requests=None,
                                                  client_procs=args.client_procs)
                        report(result)
                        results.append(result)
                        cpu[name].append(result.frontend_cpu_us or 0.0)
                ratios = [t / n for t, n in zip(cpu["tools"], cpu["no tools"], strict=True) if n]
                print(f"  {output_name}, {concurrency} streams, {args.repeats} repeats: frontend CPU µs/req "
                      f"without tools {spread(cpu['no tools'])}, with tools {spread(cpu['tools'])} "
                      f"(tool_choice none: {spread(cpu['tools, choice none'])}); "
                      f"ratio per repeat {spread(ratios, '.3f')}", flush=True)
        return results
    finally:
        processes.stop()


def spread(values: list[float], fmt: str = ".1f") -> str:
    """`median (min-max)` of `values`."""
    if not values:
        return "n/a"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def prefix_workload(count: int, seed: int = 7) -> list[bytes]:
    """`count` requests: one of the 16 shared system prompts plus a short question."""
    rng = random.Random(seed)
    systems = [
        f"You are assistant number {i}. " + " ".join(rng.choice(WORDS) for _ in range(SYSTEM_PROMPT_WORDS))
        for i in range(SYSTEM_PROMPTS)
    ]
    bodies = []
    for n in range(count):
        question = f"Question {n}: what is {rng.choice(WORDS)} {rng.choice(WORDS)} about?"
        bodies.append(json.dumps({
            "model": "tinyllama-chat",
            "messages": [{"role": "system", "content": systems[n % SYSTEM_PROMPTS]},
                         {"role": "user", "content": question}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
            "nvext": {"ignore_eos": True},
        }).encode())
    rng.shuffle(bodies)
    return bodies


async def wait_for_instances(env: dict[str, str], endpoint: str, count: int) -> None:
    """Wait until `count` instances serve `endpoint` (both workers up before measuring)."""
    from dynamo.runtime import DistributedRuntime

    os.environ.update({k: v for k, v in env.items() if k.startswith("DYN_")})
    runtime = DistributedRuntime(asyncio.get_running_loop(), False)
    try:
        client = await runtime.endpoint(endpoint).client()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while len(client.instance_ids()) < count:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{endpoint} has {len(client.instance_ids())} instances, not {count}")
            await asyncio.sleep(0.1)
    finally:
        await runtime.shutdown()


def prompt_tokens(port: int, body: bytes) -> int:
    """The prompt's token count, from a non-streamed request's usage."""
    request = json.loads(body)
    request.update({"stream": False, "max_tokens": 1})
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(request).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as r:
        return int(json.load(r)["usage"]["prompt_tokens"])


def mocker_scenario(args: argparse.Namespace, log_dir: Path) -> list[Result]:
    if not (args.model_path / "tokenizer.json").is_file():
        raise SystemExit(f"{args.model_path} has no tokenizer.json: pass --model-path DIR")
    processes = Processes(log_dir)
    port = free_port()
    env = base_env(log_dir)
    engine_args = log_dir / "mocker.json"
    engine_args.write_text(json.dumps({"num_gpu_blocks": NUM_GPU_BLOCKS, "speedup_ratio": args.speedup_ratio}))
    try:
        processes.start("mockers", [sys.executable, "-m", "dynamo.mocker", "--model-path", str(args.model_path),
                                    "--model-name", "tinyllama-chat", "--endpoint", "dyn://bench.mocker.generate",
                                    "--num-workers", "2", "--extra-engine-args", str(engine_args)], env)
        processes.start("frontend-dyn", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port),
                                         *ROUTER_MODES[args.router_mode], *args.router_args.split()], env)
        wait_for_models(port, ["tinyllama-chat"], processes)
        run_async(wait_for_instances(env, "bench.mocker.generate", 2))
        bodies = prefix_workload(args.requests)
        print(f"  prompt tokens of one request: {prompt_tokens(port, bodies[0])}")
        if args.warmup:
            # One request per system prompt, one at a time and not measured: the caches start
            # as a running server's would, instead of 32 or 128 cold prefills at once.
            warm = prefix_workload(args.warmup)
            measure("warmup", port, 1, warm, duration=None, requests=len(warm), client_procs=1)
            print(f"  warm-up: {len(warm)} requests, one at a time, not measured")
        results = []
        for concurrency in args.concurrency:
            result = measure(f"mocker/{args.router_mode}", port, concurrency, bodies, duration=None, requests=args.requests,
                             client_procs=args.client_procs)
            report(result)
            rates = run_async(prefix_hit_rates(env, "bench.mocker"))
            print(f"  prefix cache hit rate since start, per worker: {', '.join(f'{r:.2f}' for r in rates)}")
            results.append(result)
        return results
    finally:
        processes.stop()


async def prefix_hit_rates(env: dict[str, str], component: str, workers: int = 2) -> list[float]:
    """Each mocker worker's `gpu_prefix_cache_hit_rate` from its next load metrics event
    (they publish at least once a second)."""
    from dynamo.runtime import DistributedRuntime

    os.environ.update({k: v for k, v in env.items() if k.startswith("DYN_")})
    runtime = DistributedRuntime(asyncio.get_running_loop(), False)
    namespace, name = component.split(".")
    rates: dict[int, float] = {}
    try:
        subscription = await runtime.namespace(namespace).component(name).subscribe("load_metrics")

        async def collect() -> None:
            async for event in subscription:
                data = event if isinstance(event, dict) else json.loads(event)
                rates[data["worker_id"]] = data["gpu_prefix_cache_hit_rate"]
                if len(rates) >= workers:
                    return

        await asyncio.wait_for(collect(), 5)
    except asyncio.TimeoutError:
        pass
    finally:
        await runtime.shutdown()
    return sorted(rates.values())


def report(result: Result) -> None:
    s = result.summary()
    print(
        f"  {s['scenario']:<6} @{s['concurrency']:<4} {s['req_per_s']:9.1f} req/s   "
        f"TTFT p50 {s['ttft_p50_ms']:7.1f} ms  p99 {s['ttft_p99_ms']:7.1f} ms   "
        f"ITL p50 {s['itl_p50_ms']:6.2f} ms  p99 {s['itl_p99_ms']:6.2f} ms   "
        f"({s['completed']} ok, {s['errors']} errors, {result.seconds:.1f} s)"
        + (f"   frontend CPU {result.frontend_cpu_us:.1f} µs/req" if result.frontend_cpu_us is not None else ""),
        flush=True,
    )


def on_timeout(signum: int, frame: Any) -> None:
    raise TimeoutError("the benchmark ran longer than --timeout")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=["echo", "mocker", "tools", "all"], default="all")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[32, 128],
                        help="comma-separated client counts (default 32,128)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per echo level (default 10)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="measurements per variant and level in the tools scenario (default 5)")
    parser.add_argument("--requests", type=int, default=640, help="requests per mocker level (default 640)")
    parser.add_argument("--speedup-ratio", type=float, default=1.0,
                        help="the mocker's speedup_ratio (default 1: its timing model in real time)")
    parser.add_argument("--model-path", type=Path, default=DEFAULT_MODEL_PATH, help="tokenizer folder of the mocker")
    parser.add_argument("--client-procs", type=int, default=1, help="client processes sharing the clients")
    parser.add_argument("--warmup", type=int, default=SYSTEM_PROMPTS,
                        help=f"unmeasured requests before the mocker levels (default {SYSTEM_PROMPTS}: one per "
                             "system prompt; 0: start cold)")
    parser.add_argument("--router-mode", choices=list(ROUTER_MODES), default="round-robin",
                        help="the frontend's router in the mocker scenario (default round-robin; approx: "
                             "--router-mode kv --no-kv-events)")
    parser.add_argument("--router-args", default="",
                        help="more frontend router flags (mocker scenario), e.g. --router-args='--kv-overlap-weight 4'")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--log-dir", type=Path, help="keep the processes' logs here (default: a temporary folder); "
                        "DYN_LOG sets their level, e.g. DYN_LOG=warn,dynamo_llm::kv_router=debug")
    parser.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run (s)")
    args = parser.parse_args()

    signal.signal(signal.SIGALRM, on_timeout)
    signal.alarm(int(args.timeout))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="llm-bench-") as tmp:
        log_dir = args.log_dir or Path(tmp)
        log_dir.mkdir(parents=True, exist_ok=True)
        if args.scenario in ("echo", "all"):
            print("frontend + echo_full (DYN_TOKEN_ECHO_DELAY_MS=0), 2-character streaming chats", flush=True)
            results += echo_scenario(args, log_dir)
        if args.scenario in ("tools", "all"):
            print("frontend + echo_core, --tool-call-parser hermes: streamed tool calls vs the same text as content",
                  flush=True)
            results += tools_scenario(args, log_dir)
        if args.scenario in ("mocker", "all"):
            print(f"frontend + 2 mocker workers ({NUM_GPU_BLOCKS} blocks each, speedup_ratio {args.speedup_ratio}), "
                  f"{SYSTEM_PROMPTS} shared ~1k-token system prompts, max_tokens {MAX_TOKENS}, {args.requests} "
                  f"requests per level, router {' '.join([*ROUTER_MODES[args.router_mode][1:], args.router_args])}", flush=True)
            results += mocker_scenario(args, log_dir)
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2))


if __name__ == "__main__":
    main()

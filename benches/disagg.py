"""Aggregated vs disaggregated serving on the mocker: 4 workers as 4 aggregated ones,
1 prefill + 3 decode, or 2 prefill + 2 decode, behind one frontend.

    python benches/disagg.py                                   # both workloads, every topology
    python benches/disagg.py --workload long --topologies agg4,1p3d
    python benches/disagg.py --thresholds 1000:2,4000:4          # decode workers' thresholds to try
    python benches/disagg.py --json /tmp/disagg.json

Workloads (streaming chat requests, closed loop: ``--concurrency`` clients, each sending
its next request when the last one ended):

* ``long``: ``--requests`` distinct prompts of about 4,000 tokens, 256 output tokens.
* ``trace``: a bounded slice of the shared Mooncake conversation trace
  (``../shared/traces/mooncake_conversation_trace.jsonl``): its first ``--trace-requests``
  requests, each ``hash_id`` turned into a deterministic run of words (about 512 tokens,
  so equal ids give equal prefixes), prompts capped at ``--trace-max-blocks`` blocks and
  outputs at ``--trace-max-output`` tokens. Arrival times are not replayed.

Every worker is its own ``python -m dynamo.mocker`` process with the default timing
model in real time (``speedup_ratio`` 1), a 32k context, and its system server on, so that
the decode workers' ``dynamo_disagg_prefills_total`` counts (remote / local / fallback)
are printed per run. Disaggregated topologies run once per ``--thresholds`` pair
``max_local_prefill_length:max_prefill_queue_size``. The frontend routes round-robin.
Processes, client and figures are those of ``benches/llm_serving.py``; the run is bounded
by ``--timeout``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llm_serving import (
    DEFAULT_MODEL_PATH,
    DYNAMO_RUN,
    REPO_ROOT,
    WORDS,
    Processes,
    Result,
    base_env,
    free_port,
    measure,
    on_timeout,
    report,
    wait_for_models,
)

TRACE = REPO_ROOT.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
MODEL = "tinyllama-chat"
#: Words of one 512-token trace block with the TinyLlama tokenizer (about 1.09 tokens a word).
WORDS_PER_BLOCK = 470
#: Words of a ~4,000-token prompt.
LONG_PROMPT_WORDS = 3700
LONG_OUTPUT = 256
CONTEXT_LENGTH = 32768
TOPOLOGIES = {"agg4": (0, 4), "1p3d": (1, 3), "2p2d": (2, 2)}


@dataclass
class Topology:
    name: str
    prefill: int
    workers: int
    thresholds: tuple[int, int] | None

    def label(self) -> str:
        if self.thresholds is None:
            return self.name
        return f"{self.name} {self.thresholds[0]}:{self.thresholds[1]}"


def chat(content: str, max_tokens: int) -> bytes:
    return json.dumps({
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "stream": True, "nvext": {"ignore_eos": True},
    }).encode()


def long_workload(count: int, seed: int = 11) -> list[bytes]:
    rng = random.Random(seed)
    return [
        chat(f"Document {n}: " + " ".join(rng.choice(WORDS) for _ in range(LONG_PROMPT_WORDS)), LONG_OUTPUT)
        for n in range(count)
    ]


def trace_workload(path: Path, count: int, max_blocks: int, max_output: int) -> list[bytes]:
    if not path.is_file():
        raise SystemExit(f"no trace at {path}: pass --trace FILE")
    blocks: dict[int, str] = {}

    def block(hash_id: int) -> str:
        if hash_id not in blocks:
            rng = random.Random(hash_id)
            blocks[hash_id] = " ".join(rng.choice(WORDS) for _ in range(WORDS_PER_BLOCK))
        return blocks[hash_id]

    bodies = []
    with path.open() as f:
        for line in f:
            if len(bodies) >= count:
                break
            row = json.loads(line)
            ids = row["hash_ids"][:max_blocks]
            bodies.append(chat(" ".join(block(h) for h in ids), max(1, min(row["output_length"], max_output))))
    return bodies


def disagg_counts(ports: list[int]) -> dict[str, float]:
    """The decode workers' `dynamo_disagg_prefills_total`, summed by source."""
    counts = {"remote": 0.0, "local": 0.0, "fallback": 0.0}
    for port in ports:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("dynamo_disagg_prefills_total{"):
                    source = line.split('source="', 1)[1].split('"', 1)[0]
                    counts[source] += float(line.rsplit(" ", 1)[1])
    return counts


def run_topology(args: argparse.Namespace, log_dir: Path, topology: Topology, workload: str,
                 bodies: list[bytes]) -> Result:
    processes = Processes(log_dir)
    run_dir = Path(tempfile.mkdtemp(prefix=f"{topology.name}-", dir=log_dir))
    env = base_env(run_dir)
    engine_args = run_dir / "mocker.json"
    engine_args.write_text(json.dumps({"speedup_ratio": args.speedup_ratio}))
    worker = [sys.executable, "-m", "dynamo.mocker", "--model-path", str(args.model_path), "--model-name", MODEL,
              "--context-length", str(CONTEXT_LENGTH), "--extra-engine-args", str(engine_args)]
    decode_ports = []
    port = free_port()
    try:
        for i in range(topology.prefill):
            processes.start(f"prefill{i}", [*worker, "--endpoint", "dyn://bench.prefill.generate", "--role", "prefill",
                                            "--max-concurrent-prefills", str(args.max_concurrent_prefills)], env)
        role = [] if topology.prefill == 0 else ["--role", "decode"]
        if topology.thresholds is not None:
            role += ["--max-local-prefill-length", str(topology.thresholds[0]),
                     "--max-prefill-queue-size", str(topology.thresholds[1])]
        for i in range(topology.workers):
            system_port = free_port()
            decode_ports.append(system_port)
            processes.start(f"worker{i}", [*worker, "--endpoint", "dyn://bench.mocker.generate", *role],
                            {**env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1",
                             "DYN_SYSTEM_PORT": str(system_port)})
        processes.start("frontend", [*DYNAMO_RUN, "in=http", "out=dyn", "--http-port", str(port)], env)
        wait_for_models(port, [MODEL], processes)
        # Every worker discovered (its model entry listed is not enough): a fixed settle
        # time, as the frontend and the decode workers watch discovery.
        time.sleep(3)
        processes.check()
        result = measure(f"{workload} {topology.label()}", port, args.concurrency, bodies, duration=None,
                         requests=len(bodies), client_procs=1)
        report(result)
        if topology.prefill:
            counts = disagg_counts(decode_ports)
            print(f"    prefills: {counts['remote']:.0f} remote, {counts['local']:.0f} local, "
                  f"{counts['fallback']:.0f} fallback", flush=True)
        return result
    finally:
        processes.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["long", "trace", "all"], default="all")
    parser.add_argument("--topologies", default="agg4,1p3d,2p2d", help="comma-separated: agg4, 1p3d, 2p2d")
    parser.add_argument("--thresholds", default="1000:1,1000:2,2000:1",
                        help="max_local_prefill_length:max_prefill_queue_size pairs for disaggregated runs")
    parser.add_argument("--max-concurrent-prefills", type=int, default=2,
                        help="prefill workers' jobs at once (default 2; more wait in the queue)")
    parser.add_argument("--concurrency", type=int, default=16, help="clients (default 16)")
    parser.add_argument("--requests", type=int, default=64, help="requests of the long workload (default 64)")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--trace-requests", type=int, default=96)
    parser.add_argument("--trace-max-blocks", type=int, default=16, help="512-token blocks per prompt at most")
    parser.add_argument("--trace-max-output", type=int, default=256)
    parser.add_argument("--speedup-ratio", type=float, default=1.0)
    parser.add_argument("--model-path", type=Path, default=DEFAULT_MODEL_PATH)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--timeout", type=float, default=1800.0, help="bound on the whole run (s)")
    args = parser.parse_args()
    if not (args.model_path / "tokenizer.json").is_file():
        raise SystemExit(f"{args.model_path} has no tokenizer.json: pass --model-path DIR")

    thresholds = [tuple(int(x) for x in pair.split(":")) for pair in args.thresholds.split(",") if pair]
    topologies: list[Topology] = []
    for name in args.topologies.split(","):
        if name not in TOPOLOGIES:
            raise SystemExit(f"unknown topology {name!r}: expected one of {', '.join(TOPOLOGIES)}")
        prefill, workers = TOPOLOGIES[name]
        if prefill == 0:
            topologies.append(Topology(name, prefill, workers, None))
        else:
            topologies += [Topology(name, prefill, workers, (t[0], t[1])) for t in thresholds]

    signal.signal(signal.SIGALRM, on_timeout)
    signal.alarm(int(args.timeout))
    workloads = []
    if args.workload in ("long", "all"):
        workloads.append(("long", long_workload(args.requests)))
    if args.workload in ("trace", "all"):
        workloads.append(("trace", trace_workload(args.trace, args.trace_requests, args.trace_max_blocks,
                                                  args.trace_max_output)))
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="disagg-bench-") as tmp:
        for workload, bodies in workloads:
            print(f"{workload}: {len(bodies)} requests, {args.concurrency} clients, speedup_ratio "
                  f"{args.speedup_ratio}", flush=True)
            for topology in topologies:
                results.append(run_topology(args, Path(tmp), topology, workload, bodies))
    if args.json:
        args.json.write_text(json.dumps([r.summary() for r in results], indent=2))


if __name__ == "__main__":
    main()

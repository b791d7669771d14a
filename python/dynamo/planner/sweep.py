"""``python -m dynamo.planner.profile``: sweep one worker over concurrency x input length
and write the planner's JSON profile (format: ``dynamo.planner.profile``).

The worker is whatever a frontend routes the model to (``--url``: start a frontend and
exactly one worker, of any engine, yourself), or a mocker this command starts behind its
own HTTP input (``--mocker``: ``dynamo-run in=http out=mocker`` with
``--extra-engine-args``). At each point, ``concurrency`` clients each send ``--rounds``
streaming completions of ``isl`` prompt tokens and ``--osl`` output tokens, one after
the other; the first round of every client is a warm-up and is left out. TTFT is the
time to the first token, ITL the time from the first to the last token over the tokens
between, both at ``--quantile`` over the requests; throughput is the requests completed
per second after the warm-up round.

``--role`` says which worker of a disaggregated fleet the profile is for. ``prefill``:
every request asks for one token, so its TTFT is the prefill's and the throughput is
prefills a second. ``decode``: each client asks with one prompt in every round, so that
from the second round on its KV is in the worker's prefix cache (as a decode worker
receives it from a prefill worker) and the worker computes only the decode: the ITL and
throughput of decoding (the engine's prefix caching must be on, as it is by default in
the mocker and vLLM). ``agg`` (the default): a fresh prompt for every request.

Prompts are random lowercase words (a fresh prefix per request, so no prefix-cache hits,
except by design with ``--role decode``), sized for the model's tokenizer: before the
sweep, one probe prompt measures how many characters of such words make a token (the
frontend's ``usage.prompt_tokens``; 1 on the byte-level card, about 2-4 on BPE
tokenizers), and every prompt is that many characters per token asked. The token count
the frontend reports is recorded as the point's ``isl`` only when it is within 10 % of
the one asked, else the command fails naming the model's tokenization as the cause.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dynamo.planner.profile import Profile, ProfilePoint
from dynamo.supervisor import free_port

#: Bound on one request of the sweep.
REQUEST_TIMEOUT = 120.0
#: Bound on the started mocker's HTTP input coming up.
START_TIMEOUT = 60.0
#: Characters of the probe prompt that sizes prompts for the tokenizer (at most the
#: smallest ``--isl``, so that it fits wherever the sweep's prompts do).
PROBE_CHARS = 512


@dataclass
class Measured:
    """One request's figures."""

    ttft_s: float
    itl_s: float | None
    prompt_tokens: int


def quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile by linear interpolation between order statistics."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("no values")
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def prompt_of(isl: int, rng: random.Random, chars_per_token: float = 1.0) -> str:
    """About ``isl`` tokens of random words, for a tokenizer that makes a token of
    ``chars_per_token`` characters of them (1 on the byte-level card)."""
    length = max(1, round(isl * chars_per_token))
    letters = "abcdefghijklmnopqrstuvwxyz"
    words, size = [], 0
    while size < length:
        word = "".join(rng.choice(letters) for _ in range(rng.randint(3, 8)))
        words.append(word)
        size += len(word) + 1
    return " ".join(words)[:length]


def chars_per_token(host: str, port: int, model: str, chars: int, seed: int) -> float:
    """Characters of the sweep's random words per token of the model, from one probe
    prompt of ``chars`` characters and the frontend's ``usage.prompt_tokens``."""
    probe = prompt_of(chars, random.Random(seed - 1))
    try:
        tokens = one_request(host, port, model, probe, 1).prompt_tokens
    except (OSError, RuntimeError, ValueError) as e:
        raise RuntimeError(f"the probe request that sizes prompts failed: {type(e).__name__}: {e}") from e
    if tokens <= 0:
        raise RuntimeError("the frontend reported no prompt tokens (usage.prompt_tokens): prompts cannot be sized")
    return len(probe) / tokens


def one_request(host: str, port: int, model: str, prompt: str, osl: int) -> Measured:
    """A streaming completion; its TTFT, ITL and prompt tokens."""
    body = json.dumps({
        "model": model, "prompt": prompt, "max_tokens": osl, "stream": True,
        "stream_options": {"include_usage": True},
    })
    conn = http.client.HTTPConnection(host, port, timeout=REQUEST_TIMEOUT)
    started = time.monotonic()
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {response.read()[:300]!r}")
        first = last = None
        usage: dict[str, int] = {}
        while line := response.readline():
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if any(c.get("text") for c in chunk.get("choices") or []):
                last = time.monotonic()
                first = first or last
            usage = chunk.get("usage") or usage
    finally:
        conn.close()
    if first is None or last is None:
        raise RuntimeError("the stream carried no token")
    tokens = int(usage.get("completion_tokens") or 0)
    itl = (last - first) / (tokens - 1) if tokens > 1 else None
    return Measured(first - started, itl, int(usage.get("prompt_tokens") or 0))


def measure_point(
    host: str, port: int, model: str, isl: int, osl: int, concurrency: int, rounds: int, q: float, seed: int,
    per_token: float = 1.0, role: str = "agg",
) -> ProfilePoint:
    """One point of the sweep (see the module's docstring)."""
    kept: list[Measured] = []
    errors: list[str] = []
    lock = threading.Lock()
    warm = threading.Barrier(concurrency)
    marks: list[float] = []

    def client(index: int) -> None:
        rng = random.Random(seed * 1_000_003 + isl * 1009 + concurrency * 31 + index)
        # A decode worker's prompts arrive computed: one prompt a client, cached after round 0.
        same = prompt_of(isl, rng, per_token) if role == "decode" else None
        try:
            for round_ in range(rounds):
                m = one_request(host, port, model, same or prompt_of(isl, rng, per_token), osl)
                if round_ == 0:
                    warm.wait(REQUEST_TIMEOUT)
                    with lock:
                        marks.append(time.monotonic())
                    continue
                with lock:
                    kept.append(m)
        except (OSError, RuntimeError, ValueError, threading.BrokenBarrierError) as e:
            with lock:
                errors.append(f"{type(e).__name__}: {e}")
            warm.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(REQUEST_TIMEOUT * (rounds + 1))
    ended = time.monotonic()
    if errors or not kept or any(t.is_alive() for t in threads):
        raise RuntimeError(f"isl {isl}, concurrency {concurrency}: {errors[0] if errors else 'no request ended'}")
    mean_prompt = sum(m.prompt_tokens for m in kept) / len(kept)
    if abs(mean_prompt - isl) > 0.1 * isl:
        raise RuntimeError(
            f"isl {isl}: the prompts came to {mean_prompt:.0f} tokens at {per_token:.2f} characters a token "
            "(measured by the probe): the model's tokenizer does not split random words evenly"
        )
    itls = [m.itl_s for m in kept if m.itl_s is not None]
    return ProfilePoint(
        isl=isl,
        concurrency=concurrency,
        ttft_ms=quantile([m.ttft_s for m in kept], q) * 1000.0,
        itl_ms=quantile(itls, q) * 1000.0 if itls else 0.0,
        throughput_rps=len(kept) / max(ended - max(marks), 1e-9),
    )


def start_mocker(engine_args: Path | None, model_path: str | None) -> tuple[subprocess.Popen[bytes], int]:
    """``dynamo-run in=http out=mocker`` on a free port, once it serves."""
    port = free_port()
    argv = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()", "in=http", "out=mocker",
            "--http-host", "127.0.0.1", "--http-port", str(port)]
    if engine_args is not None:
        argv += ["--extra-engine-args", str(engine_args)]
    if model_path:
        argv += ["--model-path", model_path]
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"the mocker exited at start ({proc.returncode}): {out[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"the mocker did not listen on port {port} within {START_TIMEOUT:g}s")


def ints(text: str) -> list[int]:
    """``"1,2,4"`` → ``[1, 2, 4]``."""
    return sorted({int(x) for x in text.split(",") if x.strip()})


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.planner.profile``."""
    parser = argparse.ArgumentParser(prog="python -m dynamo.planner.profile", description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a frontend routing the model to exactly one worker, e.g. http://127.0.0.1:8000")
    where.add_argument("--mocker", action="store_true", help="start a mocker (dynamo-run in=http out=mocker)")
    parser.add_argument("--model", default="dynamo", help="the model name (default: the built-in card's, dynamo)")
    parser.add_argument("--model-path", help="--mocker: a HuggingFace folder for its card")
    parser.add_argument("--extra-engine-args", type=Path, help="--mocker: its settings (JSON, docs/mocker.md)")
    parser.add_argument("--isl", type=ints, default=[128, 512, 2048], help="input lengths (default 128,512,2048)")
    parser.add_argument("--concurrency", type=ints, default=[1, 2, 4, 8, 16, 32], help="default 1,2,4,8,16,32")
    parser.add_argument("--role", choices=("agg", "prefill", "decode"), default="agg",
                        help="the worker profiled: aggregated (default), prefill (one-token requests) or decode "
                        "(prompts already in its prefix cache)")
    parser.add_argument("--osl", type=int, default=64,
                        help="output tokens per request (default 64; 1 with --role prefill)")
    parser.add_argument("--rounds", type=int, default=4, help="requests per client and point, the first left out")
    parser.add_argument("--quantile", type=float, default=0.9, help="of TTFT and ITL (default 0.9)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("profile.json"))
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the first is a warm-up)")
    if not 0 < args.quantile < 1:
        parser.error("--quantile must be in (0, 1)")
    if args.role == "prefill":
        args.osl = 1
    elif args.role == "decode" and args.osl < 2:
        parser.error("--role decode needs --osl 2 or more (an ITL needs two tokens)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the sweep; the exit status (1 when a point failed)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    proc = None
    try:
        if args.mocker:
            proc, port = start_mocker(args.extra_engine_args, args.model_path)
            host, engine = "127.0.0.1", "mocker"
        else:
            url = urlsplit(args.url)
            host, port, engine = url.hostname or "127.0.0.1", url.port or 80, "unknown"
        per_token = chars_per_token(host, port, args.model, min(PROBE_CHARS, *args.isl), args.seed)
        print(f"prompts: {per_token:.2f} characters a token", flush=True)
        points = []
        for isl in args.isl:
            for concurrency in args.concurrency:
                point = measure_point(
                    host, port, args.model, isl, args.osl, concurrency, args.rounds, args.quantile, args.seed,
                    per_token, args.role,
                )
                print(
                    f"isl {isl:>6} concurrency {concurrency:>4}: TTFT {point.ttft_ms:8.1f} ms  "
                    f"ITL {point.itl_ms:7.2f} ms  {point.throughput_rps:7.2f} req/s",
                    flush=True,
                )
                points.append(point)
        Profile(engine=engine, role=args.role, quantile=args.quantile, osl=args.osl, points=points).save(args.output)
        print(f"wrote {args.output} ({len(points)} points)")
        return 0
    except RuntimeError as e:
        print(f"python -m dynamo.planner.profile: {e}", file=sys.stderr)
        return 1
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

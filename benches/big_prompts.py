"""How long a small request takes while big prompts are being refused.

Starts `dynamo-run in=http out=echo_core` (a token engine behind the preprocessor, with the
built-in card: byte-level tokenizer,
context 8,192), sends `--big` concurrent chat requests of `--size-mb` MB each, and while
they are in flight times small chat requests and `GET /health` one after another. Prints
the small requests' latencies (p50 / max) and how long the big ones took to be refused.

    PYTHONPATH=/tmp/site-rel python benches/big_prompts.py --big 2 --size-mb 20
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port: int, body: bytes, timeout: float = 120.0) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - start
    finally:
        conn.close()


def get(port: int, path: str) -> tuple[int, float]:
    start = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - start
    finally:
        conn.close()


def chat(content: str, max_tokens: int = 4) -> bytes:
    return json.dumps({"model": "dynamo", "messages": [{"role": "user", "content": content}],
                       "max_tokens": max_tokens}).encode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big", type=int, default=2, help="concurrent big prompts")
    parser.add_argument("--size-mb", type=float, default=20.0, help="size of each big prompt (MB)")
    args = parser.parse_args()

    port = free_port()
    env = {**os.environ, "DYN_TOKEN_ECHO_DELAY_MS": "0", "DYN_LOG": "warn"}
    argv = [sys.executable, "-c", "import sys; from dynamo.llm.cli import main; main()",
            "in=http", "out=echo_core", "--http-port", str(port), "--http-host", "127.0.0.1"]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get(port, "/live")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the server did not start") from None
                time.sleep(0.05)
        for _ in range(20):  # warm up
            post(port, chat("hi"))

        big = chat("word " * int(args.size_mb * 1_000_000 / 5))
        results: list[tuple[int, float]] = []
        threads = [threading.Thread(target=lambda: results.append(post(port, big))) for _ in range(args.big)]
        for t in threads:
            t.start()
        small: list[float] = []
        health: list[float] = []
        time.sleep(0.05)
        while any(t.is_alive() for t in threads):
            status, elapsed = post(port, chat("hi"))
            assert status == 200, status
            small.append(elapsed)
            health.append(get(port, "/health")[1])
        for t in threads:
            t.join()
        print(f"{args.big} prompts of {args.size_mb:g} MB: statuses {sorted(s for s, _ in results)}, "
              f"refused after {max(e for _, e in results) * 1000:.0f} ms")
        print(f"small chat requests meanwhile: {len(small)}, p50 {statistics.median(small) * 1000:.1f} ms, "
              f"max {max(small) * 1000:.1f} ms")
        print(f"/health meanwhile: p50 {statistics.median(health) * 1000:.1f} ms, max {max(health) * 1000:.1f} ms")
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()

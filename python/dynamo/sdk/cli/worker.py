"""``dynamo worker drain|resume|state HOST:PORT``: the worker admin API of a worker's
system server (``DYN_SYSTEM_ENABLED=true``, port ``DYN_SYSTEM_PORT``; docs/reliability.md,
"Drain and resume").

    dynamo worker drain 10.0.0.5:9090       # leave routing, finish what is in flight
    dynamo worker drain 10.0.0.5:9090 --wait 60   # ... and wait until drained (bounded)
    dynamo worker drain 10.0.0.5:9090 --deadline-s 30   # ... end what still runs after 30 s
                                                        #     (the frontends migrate it)
    dynamo worker state 10.0.0.5:9090
    dynamo worker resume 10.0.0.5:9090
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

#: Seconds one admin call may take.
REQUEST_TIMEOUT = 10.0
#: Seconds between state polls of ``drain --wait``.
POLL_INTERVAL = 0.2

#: verb → (HTTP method, path).
VERBS = {"drain": ("POST", "/drain"), "resume": ("POST", "/resume"), "state": ("GET", "/state")}


class AdminError(RuntimeError):
    """The worker could not be reached or refused the call."""


def call(address: str, verb: str, timeout: float = REQUEST_TIMEOUT,
         deadline_s: float | None = None) -> dict[str, Any]:
    """Call `verb` on the worker whose system server is at `address` (``HOST:PORT`` or a
    URL); returns its answer (``{"state": ..., "inflight": N, "deadline_in_s": ..., "cut":
    N}``). `deadline_s` (drain only): end the streams still in flight after that long."""
    import httpx

    method, path = VERBS[verb]
    base = address if "://" in address else f"http://{address}"
    body = {"deadline_s": deadline_s} if verb == "drain" and deadline_s is not None else None
    try:
        response = httpx.request(method, base.rstrip("/") + path, json=body, timeout=timeout)
    except httpx.HTTPError as e:
        raise AdminError(f"{verb} {address}: {e}") from e
    try:
        body = response.json()
    except json.JSONDecodeError:
        body = {"error": response.text}
    if response.status_code != 200:
        raise AdminError(f"{verb} {address}: HTTP {response.status_code}: {body.get('error', body)}")
    return body


def _run(args: argparse.Namespace, extra: Any) -> int:
    try:
        status = call(args.address, args.verb, deadline_s=args.deadline_s)
        if args.verb == "drain" and args.wait is not None:
            deadline = time.monotonic() + args.wait
            while status.get("state") != "drained" and time.monotonic() < deadline:
                time.sleep(POLL_INTERVAL)
                status = call(args.address, "state")
    except AdminError as e:
        print(f"dynamo worker: {e}", file=sys.stderr)
        return 1
    print(json.dumps(status))
    if args.verb == "drain" and args.wait is not None and status.get("state") != "drained":
        print(f"dynamo worker: still {status.get('inflight')} in flight after {args.wait} s", file=sys.stderr)
        return 3
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # argparse keeps this type private
    parser = subparsers.add_parser(
        "worker",
        help="drain, resume or inspect a worker through its system server",
        description="Call a worker's admin API (its system server, DYN_SYSTEM_ENABLED=true). drain: the worker "
        "leaves routing and finishes its in-flight requests (or, with --deadline-s, ends them after it for "
        "the frontends to migrate); resume: it takes requests again; state: serving, "
        "draining or drained, with the count in flight. Prints the worker's answer as JSON.",
    )
    parser.add_argument("verb", choices=sorted(VERBS), help="what to do")
    parser.add_argument("address", metavar="HOST:PORT", help="the worker's system server")
    parser.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                        help="drain: wait until nothing is in flight, at most this long (exit 3 if not)")
    parser.add_argument("--deadline-s", type=float, default=None, metavar="SECONDS",
                        help="drain: after this long, end the streams still in flight with a migratable error "
                        "(the frontends continue them on other workers)")
    parser.set_defaults(handler=_run)

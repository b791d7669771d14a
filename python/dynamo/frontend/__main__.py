"""``python -m dynamo.frontend``: the OpenAI HTTP frontend over discovered models.

    python -m dynamo.frontend --http-port 8000 --router-mode round-robin
    python -m dynamo.frontend --endpoint dynamo.Processor.chat     # only that endpoint's models
    python -m dynamo.frontend --store-kv etcd --request-plane nats # distributed planes

The flags map onto ``dynamo-run in=http out=dyn …`` and the plane environment variables
(``DYN_DISCOVERY_BACKEND``, ``DYN_REQUEST_PLANE``, ``DYN_EVENT_PLANE``), which the
frontend runs in this process.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Sequence

DEFAULT_PORT = 8080
#: ``--store-kv`` / ``--request-plane`` / ``--event-plane`` → the variable each sets.
PLANE_FLAGS = {
    "store_kv": ("DYN_DISCOVERY_BACKEND", ("etcd", "file", "mem")),
    "request_plane": ("DYN_REQUEST_PLANE", ("tcp", "nats")),
    "event_plane": ("DYN_EVENT_PLANE", ("nats", "tcp")),
}

#: The admission flags, passed through to ``dynamo-run`` as they are.
ADMISSION_FLAGS = ("max_inflight_requests", "max_queued_tokens", "admission_ttft_ms")


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.frontend``."""
    from dynamo._core import ROUTER_MODES

    parser = argparse.ArgumentParser(
        prog="python -m dynamo.frontend", description="OpenAI-compatible HTTP frontend for the models workers register."
    )
    parser.add_argument("--http-host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument("--http-port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--router-mode", choices=ROUTER_MODES, default="round-robin",
                        help="how a request picks a worker instance (default round-robin)")
    parser.add_argument("--namespace", help="serve only the models registered in this namespace")
    parser.add_argument("--endpoint", help="serve only the models registered on this namespace.component.endpoint")
    parser.add_argument("--migration-limit", type=int, help="times a broken stream is continued on another worker "
                             "(default 3 unless the worker registers its own; 0: off)")
    parser.add_argument("--resend-limit", type=int,
                        help="times a request no worker started is sent to another instance "
                             "(default DYN_RESEND_LIMIT, else 3)")
    zero = parser.add_argument_group("scale to zero (docs/planner.md)")
    zero.add_argument("--keep-models", action="store_true",
                      help="keep a model listed after its last worker leaves; its requests wait for a worker")
    zero.add_argument("--zero-wait-s", type=float,
                      help="with --keep-models: seconds a request waits for a worker, then 503 (default 30)")
    responses = parser.add_argument_group("/v1/responses (docs/responses.md)")
    responses.add_argument("--responses-store", choices=("memory", "discovery"),
                           help="keep responses in this process (default) or in discovery, shared by the frontends")
    responses.add_argument("--responses-ttl-s", type=float, help="seconds a stored response is kept (default 3600)")
    responses.add_argument("--responses-max", type=int, help="most responses kept (default 10000; the oldest go first)")
    streams = parser.add_argument_group("resumable streams (X-Dynamo-Resumable: true; docs/reliability.md)")
    streams.add_argument("--stream-grace-s", type=float,
                         help="seconds a stream goes on after its last reader left (default 60)")
    streams.add_argument("--stream-retention-s", type=float,
                         help="seconds a finished stream stays replayable (default 30)")
    streams.add_argument("--stream-buffer-bytes", type=int,
                         help="bytes of events one stream's replay buffer keeps (default 65536)")
    admission = parser.add_argument_group("admission, per model (docs/reliability.md)")
    admission.add_argument("--max-inflight-requests", type=int,
                           help="most requests of one model in flight; more get 429 + Retry-After")
    admission.add_argument("--max-queued-tokens", type=int,
                           help="most prompt tokens of one model waiting for their first token; more get 429")
    admission.add_argument("--admission-ttft-ms", type=int,
                           help="TTFT target (ms): 429 at admission when the router's estimate for the best "
                                "worker already exceeds it")
    kv = parser.add_argument_group("--router-mode kv (docs/kv-routing.md)")
    kv.add_argument("--kv-overlap-weight", type=float, help="weight of a KV block still to prefill (default 8)")
    kv.add_argument("--router-temperature", type=float, help="softmax temperature over the workers' cost (default 0)")
    kv.add_argument("--kv-events", action=argparse.BooleanOptionalAction, default=None,
                    help="follow the workers' KV events (default), or predict from routing decisions only")
    kv.add_argument("--busy-threshold", type=float,
                    help="KV usage fraction at which a worker is busy (503 when all are, or a wait: --busy-wait-s)")
    kv.add_argument("--busy-wait-s", type=float,
                    help="with --busy-threshold: seconds a request waits for a worker to free when all are busy, "
                    "first come first served, before the 503 (default: refused at once)")
    kv.add_argument("--router-replica-sync", action=argparse.BooleanOptionalAction, default=None,
                    help="share routing decisions with the other frontends of the same workers (default)")
    for flag, (variable, choices) in PLANE_FLAGS.items():
        parser.add_argument(f"--{flag.replace('_', '-')}", choices=choices, help=f"sets {variable}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logs (-vv: trace)")
    args = parser.parse_args(argv)
    if not 0 <= args.http_port <= 65535:
        parser.error(f"--http-port must be a port number, got {args.http_port}")
    for flag in ADMISSION_FLAGS:
        value = getattr(args, flag)
        if value is not None and value < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {value}")
    if args.resend_limit is not None and args.resend_limit < 0:
        parser.error(f"--resend-limit must be at least 0, got {args.resend_limit}")
    if args.endpoint is not None:
        args.endpoint = args.endpoint.removeprefix("dyn://")
        if len(args.endpoint.split(".")) != 3:
            parser.error(f"--endpoint must be namespace.component.endpoint, got {args.endpoint!r}")
    return args


def dynamo_run_argv(args: argparse.Namespace) -> list[str]:
    """The ``dynamo-run`` arguments of this frontend."""
    out = f"out=dyn://{args.endpoint}" if args.endpoint else "out=dyn"
    argv = ["in=http", out, "--http-host", args.http_host, "--http-port", str(args.http_port),
            "--router-mode", args.router_mode]
    if args.namespace:
        argv += ["--namespace", args.namespace]
    if args.migration_limit is not None:
        argv += ["--migration-limit", str(args.migration_limit)]
    if args.resend_limit is not None:
        argv += ["--resend-limit", str(args.resend_limit)]
    if args.keep_models:
        argv.append("--keep-models")
    if args.zero_wait_s is not None:
        argv += ["--zero-wait-s", str(args.zero_wait_s)]
    for flag in ("kv_overlap_weight", "router_temperature", "busy_threshold", "busy_wait_s", "stream_grace_s",
                 "stream_retention_s", "stream_buffer_bytes", *ADMISSION_FLAGS, "responses_store", "responses_ttl_s",
                 "responses_max"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    for flag in ("kv_events", "router_replica_sync"):
        value = getattr(args, flag)
        if value is not None:
            argv.append(f"--{'' if value else 'no-'}{flag.replace('_', '-')}")
    if args.verbose:
        argv.append("-" + "v" * min(args.verbose, 2))
    return argv


def plane_environment(args: argparse.Namespace) -> dict[str, str]:
    """The plane variables the flags set (flags win over the environment)."""
    return {variable: getattr(args, flag) for flag, (variable, _) in PLANE_FLAGS.items() if getattr(args, flag)}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the frontend until SIGINT/SIGTERM; returns the exit status."""
    from dynamo.llm import run_dynamo_run

    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    os.environ.update(plane_environment(args))
    # dynamo-run handles SIGINT/SIGTERM itself (graceful shutdown); Python's handler would
    # raise KeyboardInterrupt once the call returns.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    return run_dynamo_run(dynamo_run_argv(args))


if __name__ == "__main__":
    sys.exit(main())

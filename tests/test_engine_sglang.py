"""``python -m dynamo.sglang``'s adapter against SGLang's own classes where they import
without a GPU (``pip install --no-deps sglang`` plus torch, msgspec, pydantic, pyzmq:
``ServerArgs`` and its parser, ``SamplingParams``, ``LoadSnapshot``, ``KVEventsConfig``,
its ZMQ ``ZmqEventPublisher``), and the worker base's handler with it over a stand-in for
``sglang.Engine`` (which needs a GPU) answering in SGLang's output shape.

Skipped where SGLang does not import.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from llm_helpers import HandlerContext

sampling = pytest.importorskip(
    "sglang.srt.sampling.sampling_params",
    reason="SGLang is not importable (pip install --no-deps sglang, with torch; see docs/engines.md)",
)

from dynamo.engine import RequestError  # noqa: E402
from dynamo.engine.handler import Handler  # noqa: E402
from dynamo.sglang import adapter  # noqa: E402
from dynamo.sglang.worker import SglangAdapter  # noqa: E402


def request(**fields: Any) -> dict[str, Any]:
    return {"token_ids": [1, 2, 3], **fields}


# --- sampling parameters: SGLang's own SamplingParams accepts and verifies them -------------


def test_sampling_options_map_to_sglangs_sampling_params() -> None:
    params = adapter.sampling_params(request(
        sampling_options={"temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5,
                          "frequency_penalty": 0.25, "repetition_penalty": 1.1, "seed": 1234, "n": 2},
        stop_conditions={"max_tokens": 64, "min_tokens": 4, "stop": ["\n\n"], "stop_token_ids_hidden": [7]},
        eos_token_ids=[2],
    ))
    real = sampling.SamplingParams(**params)
    real.verify(vocab_size=1000)
    assert (real.temperature, real.top_p, real.top_k, real.min_p) == (0.7, 0.9, 40, 0.05)
    assert (real.presence_penalty, real.frequency_penalty, real.repetition_penalty) == (0.5, 0.25, 1.1)
    assert real.sampling_seed == 1234
    assert real.n == 1  # the frontend runs the engine once per choice
    assert (real.max_new_tokens, real.min_new_tokens) == (64, 4)
    assert real.stop_token_ids == {2, 7}
    assert not real.stop_strs  # stop strings stay with the frontend


def test_defaults_greedy_ignore_eos_and_no_limit() -> None:
    params = adapter.sampling_params(request(eos_token_ids=[2]))
    real = sampling.SamplingParams(**params)
    assert real.max_new_tokens is None  # SGLang's scheduler: up to the context
    assert real.stop_token_ids == {2}
    greedy = sampling.SamplingParams(**adapter.sampling_params(request(sampling_options={"temperature": 0.0})))
    assert greedy.top_k == 1  # SGLang's greedy
    unlimited = sampling.SamplingParams(**adapter.sampling_params(request(sampling_options={"top_k": -1})))
    assert unlimited.top_k == sampling.TOP_K_ALL
    ignoring = sampling.SamplingParams(
        **adapter.sampling_params(request(stop_conditions={"ignore_eos": True}, eos_token_ids=[2]))
    )
    assert ignoring.ignore_eos is True and ignoring.stop_token_ids is None


def test_response_format_becomes_a_json_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    json_schema = {"type": "json_schema", "json_schema": {"schema": schema}}
    params = adapter.sampling_params(request(response_format=json_schema))
    assert json.loads(sampling.SamplingParams(**params).json_schema) == schema
    params = adapter.sampling_params(request(response_format={"type": "json_object"}))
    assert json.loads(sampling.SamplingParams(**params).json_schema) == {"type": "object"}
    with pytest.raises(RequestError, match="not supported"):
        adapter.sampling_params(request(response_format={"type": "grammar"}))
    with pytest.raises(RequestError, match="no token_ids"):
        adapter.input_ids({"token_ids": []})


# --- outputs (the shapes of TokenizerManager's stream with skip_tokenizer_init) -------------


def out(ids: list[int], completion: int, finish: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {"output_ids": ids, "meta_info": {"finish_reason": finish, "completion_tokens": completion, **meta}}


def test_cumulative_and_incremental_streams_give_the_same_tokens() -> None:
    cumulative = [out([5], 1), out([5, 6], 2), out([5, 6, 7], 3, {"type": "length", "length": 3})]
    incremental = [out([5], 1), out([6], 2), out([7], 3, {"type": "length", "length": 3})]
    for stream in (cumulative, incremental):
        state = adapter.StreamState()
        items = [adapter.engine_output(o, state) for o in stream]
        assert items == [{"token_ids": [5]}, {"token_ids": [6]}, {"token_ids": [7], "finish_reason": "length"}]


@pytest.mark.parametrize(
    ("finish", "ours"),
    [
        ({"type": "stop", "matched": 2}, "eos"),  # FINISH_MATCHED_TOKEN of an end-of-sequence token
        ({"type": "stop", "matched": 7}, "stop"),
        ({"type": "stop", "matched": "\n\n"}, "stop"),  # FINISH_MATCHED_STR
        ({"type": "length", "length": 4}, "length"),
        ({"type": "abort", "message": "Aborted", "status_code": None, "err_type": None}, "cancelled"),
        ({"type": "abort", "message": "The input is too long", "status_code": 400, "err_type": None},
         {"error": "The input is too long"}),
    ],
)
def test_finish_reasons(finish: dict[str, Any], ours: object) -> None:
    item = adapter.engine_output(out([5], 1, finish), adapter.StreamState(eos_token_ids=[2]))
    assert item == {"token_ids": [5], "finish_reason": ours}


def test_logprobs_of_the_new_tokens() -> None:
    state = adapter.StreamState()
    first = out([11], 1, output_token_logprobs=[(-0.1, 11, None)],
                output_top_logprobs=[[(-0.1, 11, None), (-2.5, 13, None)]])
    adapter.engine_output(first, state)
    second = out([11, 12], 2, output_token_logprobs=[(-0.1, 11, None), (-4.0, 12, None)],
                 output_top_logprobs=[[(-0.1, 11, None), (-2.5, 13, None)], [(-0.3, 15, None), (-1.2, 16, None)]])
    item = adapter.engine_output(second, state)
    assert item["token_ids"] == [12] and item["log_probs"] == [-4.0]
    assert item["top_log_probs"] == [[{"token_id": 15, "logprob": -0.3}, {"token_id": 16, "logprob": -1.2}]]
    assert adapter.logprob_args(request(output_options={"logprobs": 2})) == {"return_logprob": True,
                                                                            "top_logprobs_num": 2}


# --- load, KV events, disaggregation ---------------------------------------------------------


def test_a_load_snapshot_becomes_the_routers_load_metrics() -> None:
    from sglang.srt.managers.load_snapshot import LoadSnapshot

    snapshot = LoadSnapshot(num_running_reqs=5, num_waiting_reqs=2, num_used_tokens=320, max_total_num_tokens=16000,
                            max_running_requests=64, token_usage=0.02, cache_hit_rate=0.5)
    assert adapter.load_metrics(snapshot, 16) == {
        "data_parallel_rank": None, "request_active_slots": 5, "request_total_slots": 64, "kv_active_blocks": 20,
        "kv_total_blocks": 1000, "num_requests_waiting": 2, "gpu_cache_usage_perc": 0.02,
        "gpu_prefix_cache_hit_rate": 0.5,
    }


def test_the_kv_events_config_is_sglangs() -> None:
    from sglang.srt.disaggregation.kv_events import KVEventsConfig

    text = adapter.kv_events_config(45678)
    parsed = KVEventsConfig.from_cli(text)
    assert (parsed.publisher, parsed.endpoint) == ("zmq", "tcp://*:45678")
    assert adapter.kv_events_endpoint(text) == "tcp://*:45678"
    assert adapter.kv_events_endpoint(None) is None
    assert adapter.kv_events_endpoint('{"publisher": "null"}') is None


async def test_sglangs_own_kv_event_publisher_feeds_the_kv_index(runtime: Any, namespace: str) -> None:
    """SGLang's ZmqEventPublisher (its msgspec encoding of BlockStored / BlockRemoved) →
    the base's ZMQ bridge → the event plane → a KvIndexer."""
    pytest.importorskip("msgpack", reason="the zmq extra is not installed: pip install 'ai-dynamo[zmq]'")
    import time

    from dynamo.engine.kv_events import KvEventBridge, ZmqKvEvents
    from dynamo.llm import KvIndexer
    from helpers import free_port, wait_until
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, EventBatch, ZmqEventPublisher

    component = runtime.namespace(namespace).component("sglang")
    indexer = KvIndexer(component, 4)
    port = free_port()
    endpoint = adapter.kv_events_endpoint(adapter.kv_events_config(port))
    assert endpoint is not None
    publisher = ZmqEventPublisher(attn_dp_rank=0, endpoint=endpoint)
    bridge = KvEventBridge(component, ZmqKvEvents(endpoint), 4)
    tokens = list(range(100, 112))
    hashes = [11, 22, 33]

    async def publish_until(event: Any, count: int, what: str) -> None:
        # A PUB socket drops what it sends before the subscriber is connected: resend until seen.
        scores: dict[int, int] = {}

        async def indexed() -> bool:
            nonlocal scores
            scores = (await indexer.find_matches_for_request(tokens)).scores
            if list(scores.values()) == [count]:
                return True
            publisher.publish(EventBatch(ts=time.time(), events=[event]))
            return False

        await wait_until(indexed, 15, lambda: f"{what}: the index shows {scores}, expected {count} blocks",
                         interval=0.1)

    try:
        await publish_until(BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens, block_size=4,
                                        lora_id=None, medium="GPU"), 3, "stored blocks")
        await publish_until(BlockRemoved(block_hashes=hashes[2:], medium="GPU"), 2, "a removed block")
    finally:
        await bridge.shutdown()
        publisher.shutdown()


def test_bootstrap_parameters_travel_from_prefill_to_decode() -> None:
    params = adapter.bootstrap_params("10.0.0.7", 8998)
    assert set(params) == set(adapter.BOOTSTRAP_KEYS) and 0 <= params["bootstrap_room"] < 2**63
    descriptor = json.loads(json.dumps({"request_id": "r", "engine_params": params}))
    assert adapter.decode_bootstrap(descriptor) == params
    assert adapter.decode_bootstrap(None) is None
    with pytest.raises(RequestError, match="bootstrap"):
        adapter.decode_bootstrap({"engine_params": {"bootstrap_host": "h"}})


# --- flags through SGLang's own parser and ServerArgs ----------------------------------------


def parse(argv: list[str]) -> Any:
    pytest.importorskip("dynamo._core", reason="the extension is not built")
    from dynamo.engine.config import parse_args

    return parse_args(SglangAdapter(), argv, "python -m dynamo.sglang")


def test_sglang_flags_reach_server_args_and_dynamo_flags_ours() -> None:
    config = parse(["--model-path", "/models/qwen", "--kv-cache-block-size", "16", "--context-length", "4096",
                    "--tp-size", "2", "--endpoint", "ns.sglang.generate", "--migration-limit", "2"])
    server_args = config.engine_args
    assert type(server_args).__name__ == "ServerArgs"
    assert (server_args.model_path, server_args.page_size, server_args.context_length) == ("/models/qwen", 16, 4096)
    assert server_args.tp_size == 2 and server_args.skip_tokenizer_init is True
    assert server_args.disaggregation_mode == "null" and server_args.served_model_name == "qwen"
    assert (config.endpoint, config.model_name, config.migration_limit) == ("dyn://ns.sglang.generate", "qwen", 2)


def test_roles_set_sglangs_disaggregation_mode(capsys: pytest.CaptureFixture[str]) -> None:
    prefill = parse(["--model-path", "/m", "--role", "prefill"])
    assert prefill.engine_args.disaggregation_mode == "prefill" and prefill.kv_events is False
    decode = parse(["--model-path", "/m", "--role", "decode"])
    assert decode.engine_args.disaggregation_mode == "decode"
    assert decode.max_local_prefill_length == 0  # SGLang's decode engine cannot prefill
    assert parse(["--model-path", "/m", "--role", "decode", "--max-local-prefill-length", "64"]
                 ).max_local_prefill_length == 64
    with pytest.raises(SystemExit) as exit_info:
        parse(["--model-path", "/m", "--role", "decode", "--disaggregation-mode", "prefill"])
    assert exit_info.value.code == 2 and "contradicts --role decode" in capsys.readouterr().err


def test_configure_picks_ports_for_events_and_bootstrap() -> None:
    config = parse(["--model-path", "/m", "--role", "prefill"])
    ports = iter([41001, 41002])
    worker = SglangAdapter()
    worker.configure(config, lambda: next(ports))
    assert config.engine_args.kv_events_config is None  # a prefill worker publishes none
    assert config.engine_args.disaggregation_bootstrap_port == 41001
    agg = parse(["--model-path", "/m"])
    worker.configure(agg, lambda: 41003)
    assert adapter.kv_events_endpoint(agg.engine_args.kv_events_config) == "tcp://*:41003"


# --- the base's handler with SGLang's adapter -------------------------------------------------




class TokenizerManager:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self.aborted.append(rid)


class Engine:
    """Stands in for ``sglang.Engine`` (which needs a GPU): ``async_generate`` with
    ``stream=True`` answers cumulative output dicts, as SGLang's tokenizer manager does."""

    def __init__(self, count: int, error: BaseException | None = None) -> None:
        self.count = count
        self.error = error
        self.calls: list[dict[str, Any]] = []
        self.tokenizer_manager = TokenizerManager()

    async def async_generate(self, **kwargs: Any) -> AsyncIterator[dict[str, Any]]:
        self.calls.append(kwargs)
        if self.error is not None:
            raise self.error

        async def stream() -> AsyncIterator[dict[str, Any]]:
            ids: list[int] = []
            for i in range(self.count):
                ids.append(5 + i)
                last = i == self.count - 1
                yield out(list(ids), len(ids), {"type": "length", "length": self.count} if last else None)

        return stream()


def run(engine: Engine, req: dict[str, Any], context: HandlerContext, transfer: Any = None,
        worker: SglangAdapter | None = None) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        items = []
        async for item in Handler(worker or SglangAdapter(), engine).generate(req, context, transfer):
            items.append(item)
            context.items += 1
        return items

    return asyncio.run(asyncio.wait_for(collect(), 10))


def test_the_handler_streams_sglang_outputs_and_aborts_a_stopped_request() -> None:
    engine = Engine(3)
    assert run(engine, request(), HandlerContext()) == [
        {"token_ids": [5]}, {"token_ids": [6]}, {"token_ids": [7], "finish_reason": "length"}
    ]
    call = engine.calls[0]
    assert call["input_ids"] == [1, 2, 3] and call["stream"] is True and call["rid"] == "req-1"
    assert "bootstrap_room" not in call
    stopped = Engine(10)
    items = run(stopped, request(), HandlerContext(stop_after=2))
    assert items[-1]["finish_reason"] == "cancelled" and stopped.tokenizer_manager.aborted == ["req-1"]


def test_a_request_sglang_rejects_and_a_decode_without_prefill() -> None:
    message = "The input (9000 tokens) is longer than the model's context length (4096 tokens)."
    assert run(Engine(0, error=ValueError(message)), request(), HandlerContext()) == [
        {"token_ids": [], "finish_reason": {"error": message}}
    ]
    decode = SglangAdapter()
    decode.mode = "decode"
    [item] = run(Engine(2), request(), HandlerContext(), worker=decode)
    assert "cannot prefill a prompt itself" in item["finish_reason"]["error"]
    engine = Engine(2)
    descriptor = {"engine_params": adapter.bootstrap_params("10.0.0.7", 8998, room=42)}
    run(engine, request(), HandlerContext(), descriptor, worker=decode)
    assert {k: engine.calls[0][k] for k in adapter.BOOTSTRAP_KEYS} == {
        "bootstrap_host": "10.0.0.7", "bootstrap_port": 8998, "bootstrap_room": 42}

"""``python -m dynamo.trtllm``'s pure mappings. TensorRT-LLM is not installed here (it
needs a CUDA GPU and NVIDIA's multi-GB wheels), so the engine side of each mapping is a
stand-in with the attribute names of its LLM API sources (``CompletionOutput``'s
``token_ids_diff`` / ``logprobs_diff`` / ``finish_reason`` / ``stop_reason``, the dicts of
``KVCacheEventSerializer`` and of the iteration stats); the tests that build TensorRT-LLM's
own classes skip without it."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from dynamo.engine import BlocksRemoved, BlocksStored, RequestError
from dynamo.trtllm import adapter


def request(**fields: Any) -> dict[str, Any]:
    return {"token_ids": [1, 2, 3], **fields}


def test_sampling_kwargs() -> None:
    kwargs = adapter.sampling_kwargs(request(
        sampling_options={"temperature": 0.7, "top_p": 0.9, "top_k": -1, "seed": 5, "n": 2},
        stop_conditions={"max_tokens": 64, "min_tokens": 4, "stop_token_ids_hidden": [7]},
        eos_token_ids=[2, 9], output_options={"logprobs": 3},
    ), 1000)
    assert kwargs == {"temperature": 0.7, "top_p": 0.9, "seed": 5, "end_id": 2, "stop_token_ids": [7, 9],
                      "max_tokens": 64, "min_tokens": 4, "ignore_eos": False, "logprobs": 3, "detokenize": False}
    defaults = adapter.sampling_kwargs(request(stop_conditions={"ignore_eos": True}, eos_token_ids=[2]), 500)
    assert defaults == {"max_tokens": 500, "ignore_eos": True, "detokenize": False}
    assert adapter.guided_decoding({"type": "json_object"}) == {"json_object": True}
    with pytest.raises(RequestError, match="not supported"):
        adapter.guided_decoding({"type": "grammar"})


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None


@dataclass
class Completion:
    token_ids_diff: list[int]
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    logprobs: list[Any] = field(default_factory=list)
    cumulative_logprob: float | None = None

    @property
    def logprobs_diff(self) -> list[Any]:
        return self.logprobs


@dataclass
class Result:
    outputs: list[Completion]
    finished: bool = False


@pytest.mark.parametrize(
    ("finish", "stop_reason", "ours"),
    [("stop", None, "eos"), ("stop", 7, "stop"), ("length", None, "length"), ("cancelled", None, "cancelled"),
     ("timeout", None, {"error": "TensorRT-LLM finished the request with 'timeout'"})],
)
def test_outputs_and_finish_reasons(finish: str, stop_reason: Any, ours: object) -> None:
    item = adapter.engine_output(Result([Completion([5], finish, stop_reason)], finished=True))
    assert item == {"token_ids": [5], "finish_reason": ours}
    assert adapter.engine_output(Result([Completion([5, 6])])) == {"token_ids": [5, 6]}
    unfinished = adapter.engine_output(Result([Completion([])], finished=True))
    assert "without a finish reason" in unfinished["finish_reason"]["error"]


def test_logprobs() -> None:
    step = Completion([11], logprobs=[{11: Logprob(-0.1, 1), 13: Logprob(-2.5, 2)}])
    item = adapter.engine_output(Result([step]), top_logprobs=1)
    assert item["log_probs"] == [-0.1] and item["top_log_probs"] == [[{"token_id": 11, "logprob": -0.1}]]


def test_kv_events_from_the_event_api() -> None:
    stored = {"event_id": 3, "window_size": 32, "data": {"type": "stored", "parent_hash": 77, "blocks": [
        {"type": "stored_block", "block_hash": 101, "tokens": [{"type": "unique_token", "token_id": t,
                                                                "token_extra_id": 0} for t in (1, 2)]},
        {"type": "stored_block", "block_hash": 102, "tokens": [{"type": "unique_token", "token_id": t,
                                                                "token_extra_id": 0} for t in (3, 4)]},
    ]}}
    assert adapter.kv_event(stored) == BlocksStored(3, [1, 2, 3, 4], [2, 2], [101, 102], 77)
    removed = {"event_id": 4, "data": {"type": "removed", "block_hashes": [101]}}
    assert adapter.kv_event(removed) == BlocksRemoved(4, [101])
    assert adapter.kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [8]}}) is None


def test_iteration_stats_become_load_metrics() -> None:
    stats = {"numActiveRequests": 3, "maxNumActiveRequests": 64, "numQueuedRequests": 1,
             "kvCacheStats": {"maxNumBlocks": 100, "usedNumBlocks": 25, "cacheHitRate": 0.5}}
    assert adapter.load_metrics(stats) == {
        "data_parallel_rank": None, "request_active_slots": 3, "request_total_slots": 64, "kv_active_blocks": 25,
        "kv_total_blocks": 100, "num_requests_waiting": 1, "gpu_cache_usage_perc": 0.25,
        "gpu_prefix_cache_hit_rate": 0.5,
    }


@dataclass
class DisaggregatedParams:
    request_type: str | None = None
    first_gen_tokens: list[int] | None = None
    ctx_request_id: int | None = None
    opaque_state: bytes | None = None
    draft_tokens: list[int] | None = None


def test_context_params_travel_as_json_to_the_generation_request() -> None:
    params = DisaggregatedParams("context_only", [42], 7, b"\x00\xffstate", None)
    out = adapter.prefill_transfer_params(params)
    descriptor = json.loads(json.dumps({"request_id": "r", "engine_params": out}))
    kwargs = adapter.decode_disagg_kwargs(descriptor)
    assert kwargs == {"request_type": "generation_only", "first_gen_tokens": [42], "ctx_request_id": 7,
                      "opaque_state": b"\x00\xffstate"}
    assert out["opaque_state"] == base64.b64encode(b"\x00\xffstate").decode()
    assert adapter.decode_disagg_kwargs(None) is None
    with pytest.raises(RequestError, match="cache transceiver"):
        adapter.prefill_transfer_params(None)


def test_llm_kwargs_from_flags(tmp_path: Path) -> None:
    pytest.importorskip("dynamo._core", reason="the extension is not built")
    pytest.importorskip("yaml", reason="PyYAML is not installed")
    from dynamo.engine.config import parse_args
    from dynamo.trtllm.worker import TrtllmAdapter

    extra = tmp_path / "extra.yaml"
    extra.write_text("max_batch_size: 8\nkv_cache_config:\n  free_gpu_memory_fraction: 0.5\n")
    config = parse_args(TrtllmAdapter(), ["--model-path", "/m/llama", "--context-length", "4096",
                                          "--kv-cache-block-size", "64", "--extra-engine-args", str(extra),
                                          "--role", "decode"], "python -m dynamo.trtllm")
    kwargs = config.engine_args
    assert (kwargs["model"], kwargs["max_seq_len"], kwargs["tokens_per_block"], kwargs["max_batch_size"]) == (
        "/m/llama", 4096, 64, 8)
    assert kwargs["kv_cache_config"] == {"free_gpu_memory_fraction": 0.5, "enable_block_reuse": True,
                                         "event_buffer_max_size": 1024}
    assert kwargs["cache_transceiver_config"] == {"backend": "DEFAULT"} and kwargs["skip_tokenizer_init"] is True


def test_tensorrt_llms_own_classes_accept_the_mappings() -> None:
    pytest.importorskip("tensorrt_llm", reason="TensorRT-LLM is not installed (it needs a CUDA GPU)")
    from tensorrt_llm import SamplingParams
    from tensorrt_llm.llmapi import DisaggregatedParams as Real

    params = SamplingParams(**adapter.sampling_kwargs(request(eos_token_ids=[2]), 16))
    assert (params.max_tokens, params.end_id, params.detokenize) == (16, 2, False)
    kwargs = adapter.decode_disagg_kwargs({"engine_params": {"first_gen_tokens": [1], "ctx_request_id": 3}})
    assert kwargs is not None and Real(**kwargs).request_type == "generation_only"

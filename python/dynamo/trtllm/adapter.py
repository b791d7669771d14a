"""The one module that knows TensorRT-LLM's request and response shapes, read from its
LLM API sources (``tensorrt_llm/llmapi/llm.py``, ``executor/result.py``,
``sampling_params.py``, ``disaggregated_params.py``, ``_utils.KVCacheEventSerializer``;
not run here: TensorRT-LLM needs a CUDA GPU and is not installed):

* a ``PreprocessedRequest`` becomes the prompt token ids and the keyword arguments of
  ``tensorrt_llm.SamplingParams`` (``max_tokens``, ``end_id``, ``stop_token_ids``,
  ``logprobs``, ``detokenize=False`` ...);
* each streamed ``RequestOutput`` of ``LLM.generate_async(..., streaming=True)`` becomes
  an ``LLMEngineOutput`` (``outputs[0].token_ids_diff``, ``logprobs_diff``,
  ``finish_reason`` in ``stop | length | timeout | cancelled``, ``stop_reason``);
* the dicts of ``LLM.get_kv_cache_events_async`` (``stored`` with ``parent_hash`` and
  ``blocks[].block_hash`` / ``tokens[].token_id``, ``removed`` with ``block_hashes``)
  become :mod:`dynamo.engine.kv_events` events;
* the dicts of ``LLM.get_stats_async`` (``numActiveRequests``, ``numQueuedRequests``,
  ``maxNumActiveRequests``, ``kvCacheStats``) become load metrics;
* a context-only request's ``DisaggregatedParams`` (``first_gen_tokens``,
  ``ctx_request_id``, ``opaque_state`` bytes, ``draft_tokens``) travel as JSON (the bytes
  in base64) to the generation-only request.

Pure functions, no TensorRT-LLM import.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from dynamo.engine import BlocksRemoved, BlocksStored, KvEvent, RequestError
from dynamo.engine.logprobs import ranked_logprobs

_SAME_NAME = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed")
#: The fields of ``DisaggregatedParams`` that travel from the context to the generation request.
DISAGG_FIELDS = ("first_gen_tokens", "ctx_request_id", "opaque_state", "draft_tokens", "disagg_request_id",
                 "ctx_dp_rank", "ctx_info_endpoint")


def prompt_token_ids(request: Mapping[str, Any]) -> list[int]:
    token_ids = request.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise RequestError("the request has no token_ids")
    return token_ids


def sampling_kwargs(request: Mapping[str, Any], default_max_tokens: int) -> dict[str, Any]:
    """``tensorrt_llm.SamplingParams`` keyword arguments for a ``PreprocessedRequest``:
    the sampling options one to one (``top_k`` 0 or -1: ``None``, all tokens);
    ``max_tokens`` (absent: ``default_max_tokens``, the room left in the context, since
    TensorRT-LLM's own default is 32); ``end_id`` the card's first end-of-sequence token
    and ``stop_token_ids`` the others and ``stop_token_ids_hidden`` (with ``ignore_eos``,
    none of the card's); ``logprobs`` = N; no detokenization (the frontend does it)."""
    options: Mapping[str, Any] = request.get("sampling_options") or {}
    stop: Mapping[str, Any] = request.get("stop_conditions") or {}
    kwargs: dict[str, Any] = {key: options[key] for key in _SAME_NAME if options.get(key) is not None}
    top_k = options.get("top_k")
    if top_k is not None and int(top_k) > 0:
        kwargs["top_k"] = int(top_k)
    ignore_eos = bool(stop.get("ignore_eos") or False)
    eos = [] if ignore_eos else list(request.get("eos_token_ids") or [])
    stop_ids = list(stop.get("stop_token_ids_hidden") or []) + [t for t in eos[1:]]
    if eos:
        kwargs["end_id"] = eos[0]
    if stop_ids:
        kwargs["stop_token_ids"] = stop_ids
    max_tokens = stop.get("max_tokens")
    kwargs["max_tokens"] = int(max_tokens) if max_tokens is not None else default_max_tokens
    if stop.get("min_tokens"):
        kwargs["min_tokens"] = int(stop["min_tokens"])
    kwargs["ignore_eos"] = ignore_eos
    logprobs = (request.get("output_options") or {}).get("logprobs")
    if logprobs is not None:
        kwargs["logprobs"] = int(logprobs)
    kwargs["detokenize"] = False
    return kwargs


def guided_decoding(response_format: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``tensorrt_llm.sampling_params.GuidedDecodingParams`` keyword arguments for an
    OpenAI ``response_format`` (the LLM needs a ``guided_decoding_backend``)."""
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON object")
        return {"json": schema}
    raise RequestError(f"response_format type {kind!r} is not supported")


def finish_reason(reason: str | None, stop_reason: int | str | None) -> str | dict[str, str] | None:
    """Ours for a ``CompletionOutput``'s: ``stop`` by the end id (no ``stop_reason``) is
    ``eos``, by a stop token ``stop``; ``length``; ``cancelled``; ``timeout`` an error."""
    if reason is None:
        return None
    if reason == "stop":
        return "eos" if stop_reason is None else "stop"
    if reason in ("length", "cancelled"):
        return reason
    return {"error": f"TensorRT-LLM finished the request with '{reason}'"}


def engine_output(result: Any, top_logprobs: int = 0) -> dict[str, Any]:
    """One ``LLMEngineOutput`` from a streamed ``RequestOutput`` (its first completion)."""
    completion = result.outputs[0]
    tokens = list(completion.token_ids_diff)
    item: dict[str, Any] = {"token_ids": tokens}
    logprobs = completion.logprobs_diff if completion.logprobs else None
    if logprobs:
        if isinstance(logprobs[0], Mapping):
            item["log_probs"], item["top_log_probs"] = ranked_logprobs(tokens, logprobs, top_logprobs)
        else:
            item["log_probs"] = [float(lp) for lp in logprobs]
    if completion.cumulative_logprob is not None:
        item["cum_log_probs"] = completion.cumulative_logprob
    reason = finish_reason(completion.finish_reason, completion.stop_reason)
    if reason is not None:
        item["finish_reason"] = reason
    elif result.finished:
        item["finish_reason"] = {"error": "TensorRT-LLM finished the request without a finish reason"}
    return item


# --- disaggregated serving ---------------------------------------------------------------


def prefill_transfer_params(params: Any) -> dict[str, Any]:
    """A context-only request's ``DisaggregatedParams`` as JSON: what the generation-only
    request needs (``opaque_state`` base64-encoded)."""
    if params is None:
        raise RequestError(
            "TensorRT-LLM finished the context phase without disaggregated parameters: is a cache transceiver "
            "configured (cache_transceiver_config)?"
        )
    out: dict[str, Any] = {}
    for key in DISAGG_FIELDS:
        value = getattr(params, key, None)
        if value is None:
            continue
        out[key] = base64.b64encode(value).decode("ascii") if key == "opaque_state" else value
    return out


def decode_disagg_kwargs(transfer: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``DisaggregatedParams`` keyword arguments of a generation-only request from the
    prefill's descriptor (its ``engine_params``); ``None`` to run both phases here."""
    if transfer is None:
        return None
    params = transfer.get("engine_params")
    if not isinstance(params, Mapping) or not params:
        return None
    kwargs = {key: params[key] for key in DISAGG_FIELDS if params.get(key) is not None}
    if "opaque_state" in kwargs:
        kwargs["opaque_state"] = base64.b64decode(kwargs["opaque_state"])
    return {"request_type": "generation_only", **kwargs}


# --- KV events and load -------------------------------------------------------------------


def kv_event(event: Mapping[str, Any]) -> KvEvent | None:
    """Our event for one of ``get_kv_cache_events_async``'s dicts; ``None`` for those a
    router does not index (``created``, ``updated``)."""
    data: Mapping[str, Any] = event.get("data") or {}
    event_id = int(event.get("event_id", 0))
    kind = data.get("type")
    if kind == "stored":
        blocks = data.get("blocks") or []
        tokens = [[int(t["token_id"]) for t in block.get("tokens") or []] for block in blocks]
        return BlocksStored(
            event_id=event_id,
            token_ids=[t for block in tokens for t in block],
            num_block_tokens=[len(block) for block in tokens],
            block_hashes=[int(block["block_hash"]) for block in blocks],
            parent_hash=data.get("parent_hash"),
        )
    if kind == "removed":
        return BlocksRemoved(event_id=event_id, block_hashes=[int(h) for h in data.get("block_hashes") or []])
    return None


def load_metrics(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The load metrics a KV-aware router reads from one of ``get_stats_async``'s
    iteration reports."""
    kv: Mapping[str, Any] = stats.get("kvCacheStats") or {}
    total = int(kv.get("maxNumBlocks", 0))
    used = int(kv.get("usedNumBlocks", 0))
    return {
        "data_parallel_rank": None,
        "request_active_slots": int(stats.get("numActiveRequests", 0)),
        "request_total_slots": int(stats.get("maxNumActiveRequests", 0)),
        "kv_active_blocks": used,
        "kv_total_blocks": total,
        "num_requests_waiting": int(stats.get("numQueuedRequests", 0)),
        "gpu_cache_usage_perc": used / total if total else 0.0,
        "gpu_prefix_cache_hit_rate": float(kv.get("cacheHitRate", 0.0)),
    }



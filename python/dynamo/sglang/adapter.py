"""The one module that knows SGLang's request and response shapes (checked against
SGLang 0.5.23's sources): a ``PreprocessedRequest`` dict becomes the ``input_ids`` and
the sampling-parameter dict of ``Engine.async_generate`` (the keys of
``sglang.srt.sampling.sampling_params.SamplingParams``); each streamed output dict
(``output_ids`` and ``meta_info``, from ``TokenizerManager`` with
``skip_tokenizer_init``) becomes an ``LLMEngineOutput`` dict; a ``LoadSnapshot``
(``TokenizerManager.get_loads``) becomes the load metrics a KV-aware router reads; the
``--kv-events-config`` JSON (``sglang.srt.disaggregation.kv_events.KVEventsConfig``)
asks SGLang's ZMQ publisher for KV events in the format vLLM uses; and disaggregation's
bootstrap parameters (``bootstrap_host``, ``bootstrap_port``, ``bootstrap_room``) travel
from the prefill worker to the decode request.

Pure functions: no SGLang import, so the worker base's tests and these run anywhere;
tests/test_engine_sglang.py checks them against SGLang's own classes where it imports.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynamo.engine import RequestError

#: ``sampling_options`` keys passed to SGLang unchanged (same name, same meaning).
_SAME_NAME = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
#: SGLang's message on a request it aborted because its caller asked (``FINISH_ABORT``'s default).
_PLAIN_ABORT = "Aborted"
#: The keys of the bootstrap parameters a prefill hands to the decode request.
BOOTSTRAP_KEYS = ("bootstrap_host", "bootstrap_port", "bootstrap_room")


def input_ids(request: Mapping[str, Any]) -> list[int]:
    """The prompt of a ``PreprocessedRequest``: its token ids, already templated and
    tokenized by the frontend (SGLang runs with ``skip_tokenizer_init``)."""
    token_ids = request.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise RequestError("the request has no token_ids")
    return token_ids


def sampling_params(request: Mapping[str, Any]) -> dict[str, Any]:
    """SGLang's sampling-parameter dict for a ``PreprocessedRequest``.

    * ``sampling_options``: temperature, top_p, min_p and the three penalties map one to
      one; ``top_k`` (0 or -1: no limit) to SGLang's -1; ``seed`` to ``sampling_seed``;
      ``n`` is not passed (the frontend runs the engine once per choice).
    * ``stop_conditions``: ``max_tokens`` to ``max_new_tokens`` (absent: ``None``, which
      SGLang's scheduler reads as up to the context), ``min_tokens`` to
      ``min_new_tokens``, ``ignore_eos``; ``stop_token_ids_hidden`` and the card's
      ``eos_token_ids`` (unless ``ignore_eos``) to ``stop_token_ids``. Stop strings stay
      with the frontend.
    * ``response_format`` ``json_schema`` / ``json_object`` to SGLang's ``json_schema``
      (a JSON string; ``{"type": "object"}`` for any object).
    """
    options: Mapping[str, Any] = request.get("sampling_options") or {}
    stop: Mapping[str, Any] = request.get("stop_conditions") or {}
    params: dict[str, Any] = {key: options[key] for key in _SAME_NAME if options.get(key) is not None}
    top_k = options.get("top_k")
    if top_k is not None:
        params["top_k"] = int(top_k) if int(top_k) > 0 else -1
    if options.get("seed") is not None:
        params["sampling_seed"] = int(options["seed"])
    ignore_eos = bool(stop.get("ignore_eos") or False)
    stop_ids = list(stop.get("stop_token_ids_hidden") or [])
    if not ignore_eos:
        stop_ids += [t for t in request.get("eos_token_ids") or [] if t not in stop_ids]
    params["max_new_tokens"] = stop.get("max_tokens")
    params["min_new_tokens"] = stop.get("min_tokens") or 0
    params["ignore_eos"] = ignore_eos
    if stop_ids:
        params["stop_token_ids"] = stop_ids
    schema = json_schema(request.get("response_format"))
    if schema is not None:
        params["json_schema"] = schema
    return params


def json_schema(response_format: Mapping[str, Any] | None) -> str | None:
    """SGLang's ``json_schema`` constraint for an OpenAI ``response_format``."""
    if not response_format or response_format.get("type") == "text":
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON object")
        return json.dumps(schema)
    raise RequestError(f"response_format type {kind!r} is not supported")


def logprob_args(request: Mapping[str, Any]) -> dict[str, Any]:
    """``async_generate``'s log-probability arguments for ``output_options.logprobs``."""
    top = (request.get("output_options") or {}).get("logprobs")
    if top is None:
        return {}
    return {"return_logprob": True, "top_logprobs_num": int(top)}


def finish_reason(reason: Mapping[str, Any] | None, eos_token_ids: Sequence[int]) -> str | dict[str, str] | None:
    """Our finish reason for SGLang's ``meta_info["finish_reason"]`` (a
    ``BaseFinishReason.to_json()``): a matched end-of-sequence token is ``eos``, any other
    matched token or string ``stop``, ``length`` the length limit; an abort is
    ``cancelled`` when it is SGLang's plain abort, else an error with its message (SGLang
    aborts requests it cannot serve with a message and a status code)."""
    if reason is None:
        return None
    kind = reason.get("type")
    if kind == "stop":
        return "eos" if reason.get("matched") in eos_token_ids else "stop"
    if kind == "length":
        return "length"
    if kind == "abort":
        message = reason.get("message") or _PLAIN_ABORT
        return "cancelled" if message == _PLAIN_ABORT else {"error": str(message)}
    return {"error": f"SGLang finished the request with {reason!r}"}


@dataclass
class StreamState:
    """What one request's conversion has seen (SGLang streams cumulative ``output_ids``
    unless ``--incremental-streaming-output``; ``meta_info["completion_tokens"]`` counts
    them either way)."""

    eos_token_ids: list[int] = field(default_factory=list)
    seen: int = 0


def engine_output(output: Mapping[str, Any], state: StreamState) -> dict[str, Any]:
    """One ``LLMEngineOutput`` dict from a streamed SGLang output: the tokens new since
    the last one (the last ``completion_tokens - seen`` of ``output_ids``, so cumulative
    and incremental streaming both work), their log probabilities when asked for, and
    the finish reason on the last."""
    meta: Mapping[str, Any] = output.get("meta_info") or {}
    ids = list(output.get("output_ids") or [])
    completion = int(meta.get("completion_tokens", state.seen + len(ids)))
    new = max(0, completion - state.seen)
    state.seen = completion
    item: dict[str, Any] = {"token_ids": ids[len(ids) - new:] if new else []}
    token_logprobs = meta.get("output_token_logprobs")
    if token_logprobs and new:
        item["log_probs"] = [float(lp) for lp, _token, *_ in token_logprobs[-new:]]
        top = meta.get("output_top_logprobs")
        if top:
            item["top_log_probs"] = [
                [{"token_id": int(t), "logprob": float(lp)} for lp, t, *_ in (candidates or [])]
                for candidates in top[-new:]
            ]
    reason = finish_reason(meta.get("finish_reason"), state.eos_token_ids)
    if reason is not None:
        item["finish_reason"] = reason
    return item


# --- disaggregated serving: SGLang's bootstrap handshake ---------------------------------


def bootstrap_params(host: str, port: int, room: int | None = None) -> dict[str, Any]:
    """A prefill's transfer parameters: where the decode engine meets the prefill
    engine (its bootstrap server) and the room that names this transfer (random 63-bit
    unless given, as SGLang's own router draws it)."""
    return {"bootstrap_host": host, "bootstrap_port": int(port),
            "bootstrap_room": random.getrandbits(63) if room is None else int(room)}


def decode_bootstrap(transfer: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The bootstrap arguments of a decode request whose prompt a prefill worker
    computes (the descriptor's ``engine_params``); ``None`` without a descriptor."""
    if transfer is None:
        return None
    params = transfer.get("engine_params")
    if not isinstance(params, Mapping) or any(params.get(key) is None for key in BOOTSTRAP_KEYS):
        raise RequestError(f"the prefill worker's descriptor lacks SGLang's bootstrap parameters: {params!r}")
    return {key: params[key] for key in BOOTSTRAP_KEYS}


def disaggregation_mode(role: str) -> str:
    """SGLang's ``--disaggregation-mode`` for a Dynamo role."""
    return {"agg": "null", "prefill": "prefill", "decode": "decode"}[role]


# --- KV events and load ---------------------------------------------------------------------


def kv_events_config(port: int) -> str:
    """``--kv-events-config`` asking SGLang's ZMQ publisher to bind every interface on
    ``port`` (the worker's bridge subscribes on loopback)."""
    return json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{port}", "topic": ""})


def kv_events_endpoint(config: str | None) -> str | None:
    """The ZMQ endpoint of a ``--kv-events-config`` JSON, or ``None`` when it publishes
    nothing."""
    if not config:
        return None
    parsed = json.loads(config)
    if parsed.get("publisher", "null") == "null":
        return None
    return str(parsed.get("endpoint") or "tcp://*:5557")


def load_metrics(snapshot: Any, page_size: int) -> dict[str, Any]:
    """The load metrics a KV-aware router reads from one of SGLang's ``LoadSnapshot``s
    (tokens counted in pages of ``page_size``)."""
    page = max(1, page_size)
    return {
        "data_parallel_rank": None,
        "request_active_slots": int(snapshot.num_running_reqs),
        "request_total_slots": int(snapshot.max_running_requests),
        "kv_active_blocks": int(snapshot.num_used_tokens) // page,
        "kv_total_blocks": int(snapshot.max_total_num_tokens) // page,
        "num_requests_waiting": int(snapshot.num_waiting_reqs),
        "gpu_cache_usage_perc": float(snapshot.token_usage),
        "gpu_prefix_cache_hit_rate": float(snapshot.cache_hit_rate),
    }

"""The one module that knows vLLM's request and response objects: a ``PreprocessedRequest``
dict (what the frontend sends a token-level worker) becomes a ``TokensPrompt`` and
``SamplingParams``; each ``RequestOutput`` vLLM yields becomes an ``LLMEngineOutput`` dict;
vLLM's scheduler stats become the load metrics a KV-aware router reads; for disaggregated
serving, the KV-transfer configuration, a prefill request's parameters, the transfer
parameters its output carries, and the decode request's parameters.

The engine-independent part (flags, registration, serving, stream ends, events, roles)
is the worker base, ``dynamo.engine``; ``worker.py`` plugs this module into it. This
module is tested against the real ``vllm`` package where it is installed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from vllm import SamplingParams, TokensPrompt
from vllm.config import KVTransferConfig, VllmConfig
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.stats import SchedulerStats

from dynamo.engine import RequestError
from dynamo.engine.logprobs import ranked_logprobs

#: ``sampling_options`` keys passed to vLLM unchanged (same name, same meaning).
_SAME_NAME = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "seed")


def tokens_prompt(request: Mapping[str, Any]) -> TokensPrompt:
    """The prompt of a ``PreprocessedRequest``: its token ids, already templated and
    tokenized by the frontend."""
    token_ids = request.get("token_ids")
    if not isinstance(token_ids, list) or not token_ids:
        raise RequestError("the request has no token_ids")
    return TokensPrompt(prompt_token_ids=token_ids)


def sampling_params(request: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None = None) -> SamplingParams:
    """vLLM's sampling parameters for a ``PreprocessedRequest``.

    * ``sampling_options``: temperature, top_p, top_k, min_p, the three penalties and seed
      map one to one; ``n`` is not passed (the frontend runs the engine once per choice).
    * ``stop_conditions``: ``max_tokens`` (absent: up to the context, vLLM's ``None``),
      ``min_tokens``, ``ignore_eos``; ``stop_token_ids_hidden`` become vLLM stop token
      ids. Stop *strings* stay with the frontend, which detokenizes and stops the stream
      (vLLM is asked not to detokenize: the frontend does it once).
    * ``eos_token_ids`` from the model card are stop tokens too, unless ``ignore_eos``.
    * ``output_options.logprobs`` = N: each token's log probability and N alternatives.
    * ``response_format`` ``json_object`` / ``json_schema``: vLLM structured outputs.
    * ``kv_transfer_params``: for vLLM's KV connector, in ``extra_args`` (disaggregation).
    """
    options: Mapping[str, Any] = request.get("sampling_options") or {}
    stop: Mapping[str, Any] = request.get("stop_conditions") or {}
    kwargs: dict[str, Any] = {key: options[key] for key in _SAME_NAME if options.get(key) is not None}
    top_k = options.get("top_k")
    if top_k is not None:
        # Ours and OpenAI-style clients use 0 or -1 for "no limit"; vLLM takes 0 or -1 too.
        kwargs["top_k"] = int(top_k)
    ignore_eos = bool(stop.get("ignore_eos") or False)
    stop_ids = list(stop.get("stop_token_ids_hidden") or [])
    if not ignore_eos:
        stop_ids += [t for t in request.get("eos_token_ids") or [] if t not in stop_ids]
    logprobs = (request.get("output_options") or {}).get("logprobs")
    return SamplingParams(
        **kwargs,
        max_tokens=stop.get("max_tokens"),
        min_tokens=stop.get("min_tokens") or 0,
        ignore_eos=ignore_eos,
        stop_token_ids=stop_ids or None,
        logprobs=logprobs,
        structured_outputs=structured_outputs(request.get("response_format")),
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
        extra_args={"kv_transfer_params": dict(kv_transfer_params)} if kv_transfer_params is not None else None,
    )


# --- disaggregated serving: vLLM's KV connector (NixlConnector by default) ---------------

#: The KV connector of a prefill or decode worker unless ``--kv-transfer-config`` names one.
DEFAULT_KV_CONNECTOR = "NixlConnector"

#: What a prefill request tells vLLM's connector: keep the KV for a remote decode, and
#: return its transfer parameters with the output (the keys vLLM's own P/D proxy sends).
PREFILL_TRANSFER_PARAMS: Mapping[str, Any] = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}


def kv_transfer_config(given: KVTransferConfig | None) -> KVTransferConfig:
    """The KV-transfer configuration of a prefill or decode worker: the one given with
    vLLM's ``--kv-transfer-config`` unchanged, else ``NixlConnector`` with ``kv_role``
    ``kv_both`` (either side of a transfer) and ``kv_load_failure_policy`` ``recompute``:
    a decode whose KV cannot be pulled computes the prompt itself, as the core's
    fallback does, instead of failing the request."""
    if given is not None and given.kv_connector:
        return given
    return KVTransferConfig(kv_connector=DEFAULT_KV_CONNECTOR, kv_role="kv_both", kv_load_failure_policy="recompute")


def prefill_sampling_params(request: Mapping[str, Any]) -> SamplingParams:
    """A prefill worker's request: the prompt's sampling parameters, one token, and the
    connector told to hold the KV for a remote decode."""
    one_token = {**request, "stop_conditions": {**(request.get("stop_conditions") or {}), "max_tokens": 1}}
    return sampling_params(one_token, PREFILL_TRANSFER_PARAMS)


def prefill_transfer_params(output: RequestOutput) -> dict[str, Any]:
    """The transfer parameters vLLM's connector put on a prefill's final output (remote
    engine id, block ids, host and port ...): what the decode side's engine needs."""
    params = output.kv_transfer_params
    if not output.finished or not isinstance(params, dict) or not params:
        raise RequestError(
            "vLLM finished the prefill without KV transfer parameters: is a KV connector configured "
            "(--kv-transfer-config)?"
        )
    return dict(params)


def decode_transfer_params(transfer: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The ``kv_transfer_params`` of a decode request whose prompt a prefill worker
    computed: the prefill's parameters (the descriptor's ``engine_params``) with
    ``do_remote_prefill`` set, so that the connector pulls the KV instead of computing
    it. ``None`` for a local prefill (no descriptor, or one without parameters)."""
    if transfer is None:
        return None
    params = transfer.get("engine_params")
    if not isinstance(params, Mapping) or not params:
        return None
    return {**params, "do_remote_prefill": True, "do_remote_decode": False}


def structured_outputs(response_format: Mapping[str, Any] | None) -> StructuredOutputsParams | None:
    """vLLM's structured-output constraint for an OpenAI ``response_format`` (already
    validated by the frontend); ``None`` for ``text`` or none."""
    if not response_format:
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        schema = (response_format.get("json_schema") or {}).get("schema")
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON object")
        if response_format.get("compact"):
            return StructuredOutputsParams(grammar=compact_json_grammar(schema))
        return StructuredOutputsParams(json=schema)
    if kind == "text":
        return None
    raise RequestError(f"response_format type {kind!r} is not supported")


def compact_json_grammar(schema: Mapping[str, Any]) -> str:
    """An EBNF grammar of the JSON that ``schema`` accepts, with no optional whitespace
    (one fixed space after ``,`` and ``:``). The frontend asks for it for the tool calls of
    ``tool_choice: required`` / a named function: under a grammar with free whitespace a
    weak model pads with whitespace until ``max_tokens`` and the JSON never closes. vLLM's
    own ``disable_any_whitespace`` is an engine-wide setting (it ignores the per-request
    field), so the grammar is built here with xgrammar, vLLM's default backend."""
    import xgrammar

    return str(xgrammar.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False))


def finish_reason(reason: str | None, stop_reason: int | str | None) -> str | dict[str, str] | None:
    """Our finish reason for vLLM's ``finish_reason`` / ``stop_reason``: an end-of-sequence
    token is ``eos``, a stop token or string ``stop``, the length limit ``length``, an
    abort ``cancelled``; anything else is an error naming it."""
    if reason is None:
        return None
    if reason == "stop":
        return "eos" if stop_reason is None else "stop"
    if reason == "length":
        return "length"
    if reason == "abort":
        return "cancelled"
    return {"error": f"vLLM finished the request with '{reason}'"}


def engine_output(output: RequestOutput, top_logprobs: int = 0) -> dict[str, Any]:
    """One ``LLMEngineOutput`` dict from a DELTA ``RequestOutput`` (its first completion:
    the frontend asks for one per request); ``top_logprobs``: the alternatives asked for
    per token (vLLM adds the sampled token when it is not among them). The last item
    carries the prompt tokens vLLM had cached (``cached_tokens``)."""
    completion = output.outputs[0]
    item: dict[str, Any] = {"token_ids": list(completion.token_ids)}
    if completion.logprobs:
        log_probs, top = ranked_logprobs(completion.token_ids, completion.logprobs, top_logprobs)
        item["log_probs"] = log_probs
        item["top_log_probs"] = top
    if completion.cumulative_logprob is not None:
        item["cum_log_probs"] = completion.cumulative_logprob
    reason = finish_reason(completion.finish_reason, completion.stop_reason)
    if reason is not None:
        item["finish_reason"] = reason
    elif output.finished:
        # Finished without a reason would read as a truncated stream: say so.
        item["finish_reason"] = {"error": "vLLM finished the request without a finish reason"}
    if output.finished and output.num_cached_tokens is not None:
        # The prompt tokens vLLM found in its prefix cache: the frontend's
        # usage.prompt_tokens_details.cached_tokens.
        item["cached_tokens"] = output.num_cached_tokens
    return item


def load_metrics(
    scheduler_stats: SchedulerStats, vllm_config: VllmConfig, engine_index: int = 0
) -> dict[str, Any]:
    """The load metrics a KV-aware router reads (``ForwardPassMetrics``, the mocker's
    shape) from one of vLLM's scheduler reports."""
    total_blocks = vllm_config.cache_config.num_gpu_blocks or 0
    usage = float(scheduler_stats.kv_cache_usage)
    prefix = scheduler_stats.prefix_cache_stats
    hit_rate = prefix.hits / prefix.queries if prefix is not None and prefix.queries else 0.0
    return {
        "data_parallel_rank": engine_index if vllm_config.parallel_config.data_parallel_size > 1 else None,
        "request_active_slots": scheduler_stats.num_running_reqs,
        "request_total_slots": vllm_config.scheduler_config.max_num_seqs,
        "kv_active_blocks": round(usage * total_blocks),
        "kv_total_blocks": total_blocks,
        "num_requests_waiting": scheduler_stats.num_waiting_reqs,
        "gpu_cache_usage_perc": usage,
        "gpu_prefix_cache_hit_rate": hit_rate,
    }


def idle_load_metrics(vllm_config: VllmConfig) -> dict[str, Any]:
    """The load metrics of a started engine before its first scheduler report: nothing
    running or waiting, its capacity (KV blocks, request slots) known. vLLM reports
    stats only while it works, so without this a router would know nothing of an idle
    worker's size."""
    return {
        "data_parallel_rank": None,
        "request_active_slots": 0,
        "request_total_slots": vllm_config.scheduler_config.max_num_seqs,
        "kv_active_blocks": 0,
        "kv_total_blocks": vllm_config.cache_config.num_gpu_blocks or 0,
        "num_requests_waiting": 0,
        "gpu_cache_usage_perc": 0.0,
        "gpu_prefix_cache_hit_rate": 0.0,
    }


class LoadStatLogger(StatLoggerBase):
    """A vLLM stat logger that hands each scheduler report, as load metrics, to
    ``publish`` (called on vLLM's output-handler task, so it must not block)."""

    def __init__(
        self, vllm_config: VllmConfig, engine_index: int = 0, publish: Callable[[dict[str, Any]], None] | None = None
    ) -> None:
        self.vllm_config = vllm_config
        self.engine_index = engine_index
        self.publish = publish

    @classmethod
    def factory(cls, publish: Callable[[dict[str, Any]], None]) -> Callable[[VllmConfig, int], LoadStatLogger]:
        """What ``AsyncLLM.from_engine_args(stat_loggers=[...])`` takes."""
        return lambda vllm_config, engine_index: cls(vllm_config, engine_index, publish)

    def record(
        self,
        scheduler_stats: SchedulerStats | None,
        iteration_stats: Any = None,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        if scheduler_stats is not None and self.publish is not None:
            self.publish(load_metrics(scheduler_stats, self.vllm_config, engine_idx))

    def log_engine_initialized(self) -> None:
        pass

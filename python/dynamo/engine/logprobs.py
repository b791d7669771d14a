"""Log probabilities in our output format from the per-token ``{token_id: Logprob}``
maps that vLLM and TensorRT-LLM both return (objects with ``logprob`` and ``rank``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def ranked_logprobs(
    token_ids: Sequence[int], per_token: Sequence[Mapping[int, Any]], top_n: int
) -> tuple[list[float], list[list[dict[str, Any]]]]:
    """Each sampled token's log probability, and the ``top_n`` most likely alternatives,
    most likely first (by rank; the engine adds the sampled token when it is not among
    them)."""
    log_probs: list[float] = []
    top: list[list[dict[str, Any]]] = []
    for token, candidates in zip(token_ids, per_token, strict=False):
        chosen = candidates.get(token)
        log_probs.append(float(chosen.logprob) if chosen is not None else float("-inf"))
        ranked = sorted(candidates.items(), key=lambda kv: (kv[1].rank if kv[1].rank is not None else 1 << 30))
        top.append([{"token_id": int(t), "logprob": float(lp.logprob)} for t, lp in ranked[:top_n]])
    return log_probs, top

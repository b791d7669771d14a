"""Test worker: ``python -m dynamo.vllm`` as it serves — flags through vLLM's own parser,
``configure_disagg``, the worker base's ``Handler`` and ``serve_role`` in any role — with a stand-in for
``AsyncLLM`` (which needs a GPU) that answers with vLLM's own ``RequestOutput`` objects
the way vLLM's NixlConnector does: a prefill request (``do_remote_decode``) finishes
with ``kv_transfer_params`` naming this process's engine and the request; a decode
request with ``do_remote_prefill`` prints ``PULL <request id> <json of its
kv_transfer_params>`` (the connector would pull the KV now), one without prints
``LOCAL <request id>``. Needs the vllm package.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

from dynamo.engine.handler import Handler
from dynamo.engine.serve import serve_role
from dynamo.runtime import DistributedRuntime, dynamo_worker
from dynamo.supervisor import free_port
from dynamo.vllm.args import parse_args
from dynamo.vllm.worker import VllmAdapter, configure_disagg
from vllm.outputs import CompletionOutput, RequestOutput

FIRST_WORD_TOKEN = 3


def output(request_id: str, prompt: list[int], token: int, finished: bool) -> RequestOutput:
    completion = CompletionOutput(
        index=0, text="", token_ids=[token], cumulative_logprob=None, logprobs=None,
        finish_reason="length" if finished else None, stop_reason=None,
    )
    return RequestOutput(
        request_id=request_id, prompt=None, prompt_token_ids=prompt, prompt_logprobs=None, outputs=[completion],
        finished=finished,
    )


class StandInEngine:
    """The calls ``Handler`` makes on ``AsyncLLM``."""

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[RequestOutput]:
        tokens = list(prompt["prompt_token_ids"])
        transfer = (params.extra_args or {}).get("kv_transfer_params")
        if transfer and transfer.get("do_remote_decode"):
            assert params.max_tokens == 1, params
            final = output(request_id, tokens, FIRST_WORD_TOKEN, True)
            final.kv_transfer_params = {
                "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": [[0, 1, 2]],
                "remote_engine_id": f"standin-{os.getpid()}", "remote_request_id": request_id,
                "remote_host": "127.0.0.1", "remote_port": 5600, "tp_size": 1, "remote_num_tokens": len(tokens),
            }
            print(f"PREFILL {request_id}", flush=True)
            yield final
            return
        if transfer and transfer.get("do_remote_prefill"):
            print(f"PULL {request_id} {json.dumps(transfer, sort_keys=True)}", flush=True)
        else:
            print(f"LOCAL {request_id}", flush=True)
        count = params.max_tokens or 4
        for i in range(count):
            yield output(request_id, tokens, FIRST_WORD_TOKEN + i, i == count - 1)

    async def abort(self, request_id: str) -> None:
        pass


CONFIG = parse_args(sys.argv[1:])


@dynamo_worker()
async def main(runtime: DistributedRuntime) -> None:
    configure_disagg(CONFIG, free_port(""))
    kv = CONFIG.engine_args.kv_transfer_config
    print(f"CONNECTOR {kv.kv_connector if kv else None}", flush=True)
    endpoint = runtime.endpoint(CONFIG.endpoint)
    await serve_role(runtime, CONFIG, endpoint, Handler(VllmAdapter(), StandInEngine(), runtime), 4096, 16)


if __name__ == "__main__":
    asyncio.run(main())

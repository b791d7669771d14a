"""SGLang's adapter of the worker base (``dynamo.engine``): an ``sglang.Engine`` built
from SGLang's own server arguments (``ServerArgs.add_cli_args`` / ``from_cli_args``) with
``skip_tokenizer_init`` (the frontend tokenizes), requests through
``Engine.async_generate(input_ids=..., sampling_params=..., stream=True, rid=...)``,
aborts through ``TokenizerManager.abort_request(rid)``, KV events from SGLang's ZMQ
publisher (``--kv-events-config``), load from ``TokenizerManager.get_loads()`` polled
once a second, and disaggregation through SGLang's bootstrap handshake
(``--disaggregation-mode prefill|decode``).

SGLang's prefill and decode engines meet at the prefill engine's bootstrap server and
transfer while both run the request, so a prefill job here *starts* the prefill request
and returns its bootstrap parameters at once (the request runs on in the background
until the decode engine has pulled the KV); the decode request carries the same
parameters. A decode-mode SGLang engine cannot compute a prompt itself: a decode
request the core keeps local (queue full, timeout) ends with an error naming that.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from dynamo.engine.adapter import EngineAdapter, Failure, LoadCallback, RequestError
from dynamo.engine.config import WorkerConfig
from dynamo.engine.kv_events import KvEventSource, ZmqKvEvents

from . import adapter

log = logging.getLogger("dynamo.sglang")

#: Seconds between two load reports.
LOAD_INTERVAL = 1.0


def given(argv: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in argv)


class SglangAdapter(EngineAdapter):
    """SGLang's offline ``Engine`` (its tokenizer manager, scheduler and detokenizer
    processes), driven from this process's event loop."""

    name = "SGLang"
    package = "sglang"
    install_hint = "pip install sglang (a CUDA GPU is needed to run it)"
    own_flags = frozenset({"--model-path", "--context-length"})

    def __init__(self) -> None:
        self.mode = "null"
        self.bootstrap_host: str | None = None
        self.background: set[asyncio.Task[None]] = set()

    def parser(self, prog: str, description: str) -> argparse.ArgumentParser:
        from sglang.srt.server_args import ServerArgs

        p = argparse.ArgumentParser(prog=prog, description=description)
        ServerArgs.add_cli_args(p)
        return p

    def model_path(self, ns: argparse.Namespace) -> str | None:
        return ns.model_path

    def served_model_name(self, ns: argparse.Namespace) -> str | None:
        return ns.served_model_name

    def engine_args(
        self, ns: argparse.Namespace, argv: Sequence[str], parser: argparse.ArgumentParser, config: WorkerConfig
    ) -> Any:
        """SGLang's ``ServerArgs``: ``--kv-cache-block-size`` is ``--page-size``; the role
        sets ``--disaggregation-mode`` (given both, they must agree); a decode worker
        sends every prompt it can to the prefill workers unless told otherwise
        (``--max-local-prefill-length 0``), since it cannot prefill itself."""
        from sglang.srt.server_args import ServerArgs

        if ns.kv_cache_block_size is not None:
            ns.page_size = ns.kv_cache_block_size
        mode = adapter.disaggregation_mode(config.role)
        if given(argv, "--disaggregation-mode") and ns.disaggregation_mode != mode:
            parser.error(f"--disaggregation-mode {ns.disaggregation_mode} contradicts --role {config.role}")
        ns.disaggregation_mode = mode
        if config.role == "decode" and not given(argv, "--max-local-prefill-length"):
            config.max_local_prefill_length = 0
        if config.kv_events and ns.disable_radix_cache:
            parser.error("--kv-events needs SGLang's radix cache (drop --disable-radix-cache, or pass --no-kv-events)")
        ns.skip_tokenizer_init = True
        if not ns.served_model_name:
            ns.served_model_name = config.model_name
        self.mode = mode
        return ServerArgs.from_cli_args(ns)

    def configure(self, config: WorkerConfig, free_port: Callable[[], int]) -> None:
        """KV events on a free port (unless ``--kv-events-config`` set its own); a prefill
        worker's bootstrap server on a free port unless ``--disaggregation-bootstrap-port``
        was given (two prefill workers on one host would collide on SGLang's 8998)."""
        server_args = config.engine_args
        if config.kv_events and not server_args.kv_events_config:
            server_args.kv_events_config = adapter.kv_events_config(config.kv_events_port or free_port())
        if config.role == "prefill" and server_args.disaggregation_bootstrap_port == 8998:
            server_args.disaggregation_bootstrap_port = free_port()

    async def start(self, config: WorkerConfig, on_load: LoadCallback | None) -> Any:
        import sglang

        if config.role == "prefill":
            from sglang.srt.utils.network import get_local_ip_auto

            self.bootstrap_host = get_local_ip_auto()
        return sglang.Engine(server_args=config.engine_args)

    def limits(self, engine: Any) -> tuple[int, int]:
        return int(engine.tokenizer_manager.context_len), int(engine.server_args.page_size or 1)

    def kv_events(self, config: WorkerConfig, engine: Any) -> KvEventSource | None:
        endpoint = adapter.kv_events_endpoint(engine.server_args.kv_events_config)
        return ZmqKvEvents(endpoint) if endpoint is not None else None

    async def load_reports(self, engine: Any) -> AsyncIterator[dict[str, Any]]:
        page_size = int(engine.server_args.page_size or 1)
        while True:
            for snapshot in await engine.tokenizer_manager.get_loads():
                yield adapter.load_metrics(snapshot, page_size)
            await asyncio.sleep(LOAD_INTERVAL)

    async def stop(self, engine: Any) -> None:
        for task in list(self.background):
            task.cancel()
        for task in list(self.background):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        engine.shutdown()

    def prepare(self, request: Mapping[str, Any], transfer: Mapping[str, Any] | None = None) -> Any:
        bootstrap = adapter.decode_bootstrap(transfer)
        if bootstrap is None and self.mode == "decode":
            raise RequestError(
                "SGLang's decode engine (--disaggregation-mode decode) cannot prefill a prompt itself, and no "
                "prefill worker took this one (queue full or timed out): add prefill workers or raise "
                "--max-prefill-queue-size / --remote-prefill-timeout"
            )
        kwargs = {
            "input_ids": adapter.input_ids(request),
            "sampling_params": adapter.sampling_params(request),
            **adapter.logprob_args(request),
            **(bootstrap or {}),
        }
        return kwargs, adapter.StreamState(eos_token_ids=list(request.get("eos_token_ids") or []))

    async def generate(self, engine: Any, prepared: Any, request_id: str) -> AsyncIterator[dict[str, Any]]:
        kwargs, state = prepared
        stream = await engine.async_generate(**kwargs, stream=True, rid=request_id)
        async for output in stream:
            yield adapter.engine_output(output, state)

    async def abort(self, engine: Any, request_id: str) -> None:
        engine.tokenizer_manager.abort_request(rid=request_id)

    def failure(self, error: BaseException) -> Failure | None:
        # The tokenizer manager validates a request (prompt over the context, bad
        # sampling parameters) with ValueError; its subprocesses dying surface as
        # RuntimeError from the manager's loop.
        if isinstance(error, (ValueError, TypeError)):
            return Failure.REJECTED
        if isinstance(error, (RuntimeError, ConnectionError, EOFError)):
            return Failure.DEAD
        return None

    async def prefill(
        self, engine: Any, request: Mapping[str, Any], request_id: str, stopped: Callable[[], bool]
    ) -> dict[str, Any]:
        """Start the prefill request with fresh bootstrap parameters and return them;
        the request runs on (owned by this adapter, cancelled at :meth:`stop`) until
        the decode engine has pulled the KV, or SGLang's bootstrap timeout gives it up."""
        if self.bootstrap_host is None:
            raise RequestError("this SGLang engine is not a prefill engine")
        params = adapter.bootstrap_params(self.bootstrap_host, engine.server_args.disaggregation_bootstrap_port)
        one_token = {**request, "stop_conditions": {**(request.get("stop_conditions") or {}), "max_tokens": 1}}
        sampling = adapter.sampling_params(one_token)
        stream = await engine.async_generate(
            input_ids=adapter.input_ids(request), sampling_params=sampling, stream=True, rid=request_id, **params
        )
        task = asyncio.ensure_future(self._drain(stream, request_id))
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return params

    @staticmethod
    async def _drain(stream: Any, request_id: str) -> None:
        try:
            async for output in stream:
                reason = (output.get("meta_info") or {}).get("finish_reason")
                if reason is not None and reason.get("type") == "abort":
                    log.warning("SGLang gave the prefill %s up: %s", request_id, reason.get("message"))
        except Exception as e:
            log.warning("the prefill %s failed: %s", request_id, e)

"""The reference's spellings and module paths, each accepted here (issue 10's
compatibility gaps): uvloop as a dependency, `register_llm` in the reference's positional
order and before serving, `ModelType.Completion`, `ServiceConfig.get_parsed_config` on
the class, a frontend bound to one endpoint (`dynamo-run out=dyn://ns.comp.ep`),
`dynamo.runtime.logging`, `dynamo.sdk.lib.image`, `EtcdKvCache`, and fresh clients
spreading over the instances."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import tomllib
from helpers import REPO_ROOT, collect, data_of, wait_for_instances, wait_until
from llm_helpers import chat_body, start_frontend, start_mocker, streamed_content, write_json, write_model_dir

pytestmark = pytest.mark.timeout(120)


def test_uvloop_is_a_dependency() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert any(dep.split(">")[0].split("=")[0].strip() == "uvloop" for dep in project["dependencies"])
    import uvloop

    loop = uvloop.new_event_loop()
    try:
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()


def test_model_type_spellings() -> None:
    from dynamo.llm import ModelType

    assert ModelType.Completion == ModelType.Completions == "completions"
    assert ModelType.Backend == "backend" and ModelType.Chat == "chat"


def test_get_parsed_config_on_the_class(monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo.sdk.lib.config import ServiceConfig

    config = {"Common": {"block-size": 64}, "Frontend": {"port": 8000, "common-configs": ["block-size"],
                                                         "ServiceArgs": {"workers": 2}}}
    monkeypatch.setenv("DYNAMO_SERVICE_CONFIG", json.dumps(config))
    ServiceConfig.reset()
    try:
        assert ServiceConfig.get_parsed_config("Frontend") == {"block-size": 64, "port": 8000}
        assert ServiceConfig.get_instance().get_parsed_config("Frontend") == {"block-size": 64, "port": 8000}
        assert ServiceConfig.get_parsed_config("Absent") == {}
    finally:
        ServiceConfig.reset()


def test_reference_module_paths(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from dynamo.runtime import EtcdKvCache
    from dynamo.runtime.logging import configure_dynamo_logging
    from dynamo.sdk import DYNAMO_IMAGE as from_sdk
    from dynamo.sdk.lib.image import DYNAMO_IMAGE

    assert isinstance(DYNAMO_IMAGE, str) and DYNAMO_IMAGE and from_sdk == DYNAMO_IMAGE
    assert hasattr(EtcdKvCache, "create")

    monkeypatch.setenv("DYN_LOG", "warn")
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_dynamo_logging(service_name="Processor", worker_id=3)
        configure_dynamo_logging(service_name="Processor", worker_id=3)  # idempotent: one handler
        logging.getLogger("compat").info("hidden at warn")
        logging.getLogger("compat").warning("shown")
        err = capsys.readouterr().err
        assert err.count("shown") == 1 and "[Processor:3] compat: shown" in err
        assert "hidden" not in err
    finally:
        root.handlers[:], root.level = saved


async def test_etcd_kv_cache(runtime, namespace: str) -> None:
    from dynamo.runtime import EtcdKvCache

    prefix = f"/{namespace}/processor/"
    with pytest.raises(TypeError):
        EtcdKvCache(runtime.etcd_client(), prefix)
    cache = await EtcdKvCache.create(runtime.etcd_client(), prefix, {"router": "round-robin", "n": b"1"})
    assert await cache.get("router") == b"round-robin"
    # A second creator keeps what is there (first writer wins).
    again = await EtcdKvCache.create(runtime.etcd_client(), prefix, {"router": "kv"})
    assert await again.get("router") == b"round-robin"
    await cache.put("router", "kv")
    assert await again.get("router") == b"kv"
    assert await cache.get_all() == {"router": b"kv", "n": b"1"}
    await cache.delete("n")
    assert await cache.get("n") is None
    await cache.clear_all()
    assert await cache.get_all() == {}


async def test_fresh_clients_spread(workers, runtime, namespace: str) -> None:
    """A fresh client per request (one-shot clients) must not always pick the same instance."""
    for _ in range(2):
        await workers.start("stream_worker.py", "--namespace", namespace)
    path = f"{namespace}.backend.generate"
    await wait_for_instances(await runtime.endpoint(path).client(), 2)
    seen = set()
    for _ in range(16):
        client = await runtime.endpoint(path).client()
        await wait_for_instances(client, 2)
        items = await collect(await client.generate({"count": 1}))
        seen.add(data_of(items[0])["instance_id"])
    assert len(seen) == 2


REFERENCE_ORDER = """
import asyncio, pathlib, sys
from dynamo.llm import ModelType, register_llm
from dynamo.runtime import DistributedRuntime, dynamo_worker

async def generate(request):
    for token in request["token_ids"][:3]:
        yield {"token_ids": [token]}
    yield {"token_ids": [], "finish_reason": "stop"}

@dynamo_worker()
async def worker(runtime: DistributedRuntime):
    component = runtime.namespace(sys.argv[1]).component("backend")
    await component.create_service()
    endpoint = component.endpoint("generate")
    # The reference's order, and registration before the endpoint serves.
    await register_llm(ModelType.Backend, endpoint, None, "early-bird")
    print("REGISTERED", flush=True)
    # Serve once the test has checked the registered-but-not-serving state (it creates
    # this file then); 60 s at most.
    go = pathlib.Path(sys.argv[2])
    for _ in range(1200):
        if go.exists():
            break
        await asyncio.sleep(0.05)
    print("SERVING", flush=True)
    await endpoint.serve_endpoint(generate)

asyncio.run(worker())
"""


async def test_register_llm_reference_order_before_serving(workers, namespace: str, tmp_path: Path) -> None:
    script = tmp_path / "reference_order.py"
    script.write_text(REFERENCE_ORDER)
    frontend = await start_frontend(workers, "dyn")
    go = tmp_path / "serve-now"
    worker = workers.command([sys.executable, str(script), namespace, str(go)], name="early")
    await worker.wait_for_line("REGISTERED", 30)
    # Registered, not serving: once the frontend has seen the entry (a request gets 503,
    # not 404), the model is still not listed, nor routed to.
    def known() -> Any:
        response = frontend.post("/v1/chat/completions", chat_body("early-bird", "hi"))
        return response if response.status != 404 else None

    refused = await wait_until(
        known, 30, lambda: f"the frontend to see early-bird's entry\n{worker.describe()}", interval=0.1
    )
    assert refused.status == 503, refused.body
    assert "early-bird" not in frontend.models()
    assert not worker.find_lines("SERVING")
    go.touch()
    await worker.wait_for_line("SERVING", 30)
    await frontend.wait_models(["early-bird"])
    response = frontend.post("/v1/chat/completions", chat_body("early-bird", "hi", stream=True))
    assert response.status == 200, response.body
    content, chunks = streamed_content(response.body)
    assert content and chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_register_llm_argument_errors(runtime, namespace: str) -> None:
    from dynamo.llm import ModelType, register_llm

    endpoint = runtime.namespace(namespace).component("backend").endpoint("generate")
    with pytest.raises(TypeError, match="second argument must be an Endpoint"):
        await register_llm(ModelType.Backend, "not-an-endpoint", None, "x")
    with pytest.raises(TypeError, match="given twice"):
        await register_llm(ModelType.Backend, endpoint, None, "x", kind=ModelType.Chat)


async def test_frontend_bound_to_one_endpoint(workers, namespace: str, tmp_path: Path) -> None:
    model_dir = write_model_dir(tmp_path / "models")
    fast = write_json(tmp_path / "fast.json", {"speedup_ratio": 20.0})
    for name in ("alpha", "beta"):
        start_mocker(workers, f"{namespace}.{name}.generate", model_dir, "--model-name", name,
                     "--extra-engine-args", str(fast), name=name)
    everything = await start_frontend(workers, "dyn")
    await everything.wait_models(["alpha", "beta"])
    bound = await start_frontend(workers, f"dyn://{namespace}.beta.generate")
    await bound.wait_models(["beta"])
    assert bound.models() == ["beta"]
    assert bound.post("/v1/chat/completions", chat_body("alpha", "w3")).status == 404
    answer = bound.post("/v1/chat/completions", chat_body("beta", "w3 w4", max_tokens=4))
    assert answer.status == 200, answer.body
    assert answer.json()["usage"]["completion_tokens"] == 4


async def test_python_m_dynamo_frontend(workers, namespace: str, tmp_path: Path) -> None:
    """`python -m dynamo.frontend` with the reference's flags; `--namespace` filters."""
    from helpers import free_port
    from llm_helpers import Frontend

    model_dir = write_model_dir(tmp_path / "models")
    fast = write_json(tmp_path / "fast.json", {"speedup_ratio": 20.0})
    for ns, name in ((namespace, "mine"), (f"{namespace}_other", "theirs")):
        start_mocker(workers, f"{ns}.mocker.generate", model_dir, "--model-name", name,
                     "--extra-engine-args", str(fast), name=name)
    everything = await start_frontend(workers, "dyn")
    await everything.wait_models(["mine", "theirs"])
    port = free_port()
    argv = [sys.executable, "-m", "dynamo.frontend", "--http-host", "127.0.0.1", "--http-port", str(port),
            "--router-mode", "random", "--namespace", namespace]
    frontend = Frontend(workers.command(argv, name="python-m-frontend"), port)
    await frontend.wait_live()
    await frontend.wait_models(["mine"])
    assert frontend.models() == ["mine"]  # "theirs" is registered (see above), in another namespace
    answer = frontend.post("/v1/chat/completions", chat_body("mine", "w3 w4", max_tokens=3))
    assert answer.status == 200 and answer.json()["usage"]["completion_tokens"] == 3, answer.body


def test_python_m_dynamo_frontend_flags() -> None:
    from dynamo.frontend.__main__ import dynamo_run_argv, parse_args, plane_environment

    args = parse_args(["--http-port", "9000", "--endpoint", "dyn://dynamo.Processor.chat/completions",
                       "--store-kv", "etcd", "--request-plane", "nats"])
    assert dynamo_run_argv(args)[:2] == ["in=http", "out=dyn://dynamo.Processor.chat/completions"]
    assert plane_environment(args) == {"DYN_DISCOVERY_BACKEND": "etcd", "DYN_REQUEST_PLANE": "nats"}
    kv = dynamo_run_argv(parse_args(["--router-mode", "kv", "--kv-overlap-weight", "2", "--router-temperature", "0.5",
                                     "--busy-threshold", "0.9", "--busy-wait-s", "5", "--no-kv-events",
                                     "--no-router-replica-sync"]))
    assert kv[kv.index("--kv-overlap-weight") + 1] == "2.0"
    assert kv[kv.index("--router-temperature") + 1] == "0.5"
    assert kv[kv.index("--busy-threshold") + 1] == "0.9"
    assert kv[kv.index("--busy-wait-s") + 1] == "5.0"
    assert "--no-kv-events" in kv and "--kv-events" not in kv
    assert "--no-router-replica-sync" in kv and "--router-replica-sync" not in kv
    assert "--router-replica-sync" not in dynamo_run_argv(parse_args(["--router-mode", "kv"])), "default: dynamo-run's"
    limits = dynamo_run_argv(parse_args(["--migration-limit", "2", "--resend-limit", "0"]))
    assert limits[limits.index("--resend-limit") + 1] == "0" and limits[limits.index("--migration-limit") + 1] == "2"
    assert "--resend-limit" not in dynamo_run_argv(parse_args([])), "default: dynamo-run's (DYN_RESEND_LIMIT, else 3)"
    zero = dynamo_run_argv(parse_args(["--keep-models", "--zero-wait-s", "5"]))
    assert "--keep-models" in zero and zero[zero.index("--zero-wait-s") + 1] == "5.0"
    assert "--keep-models" not in dynamo_run_argv(parse_args([])), "models leave with their last worker by default"
    streams = dynamo_run_argv(parse_args(["--stream-grace-s", "5", "--stream-buffer-bytes", "4096"]))
    assert streams[streams.index("--stream-grace-s") + 1] == "5.0"
    assert streams[streams.index("--stream-buffer-bytes") + 1] == "4096"
    assert "--stream-retention-s" not in streams and "--migration-limit" not in dynamo_run_argv(parse_args([]))
    admission = dynamo_run_argv(parse_args(["--max-inflight-requests", "8", "--max-queued-tokens", "4096",
                                            "--admission-ttft-ms", "750"]))
    assert admission[admission.index("--max-inflight-requests") + 1] == "8"
    assert admission[admission.index("--max-queued-tokens") + 1] == "4096"
    assert admission[admission.index("--admission-ttft-ms") + 1] == "750"
    assert "--max-inflight-requests" not in dynamo_run_argv(parse_args([])), "no limit by default"
    for bad in (["--endpoint", "a.b"], ["--http-port", "70000"], ["--router-mode", "nope"],
                ["--resend-limit", "-1"], ["--resend-limit", "x"], ["--max-inflight-requests", "0"],
                ["--max-queued-tokens", "-5"], ["--admission-ttft-ms", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            parse_args(bad)
        assert exit_info.value.code == 2

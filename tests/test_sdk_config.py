"""SDK configuration, graph structure and the serve plan: no runtime needed.

ServiceConfig (get/require/as_args, Common), command-line overrides, precedence
(CLI > YAML > decorator > constructor defaults) including the seeds' complete example,
type errors, `.link()` pruning, abstract services, GPU assignment, `--dry-run`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from dynamo.sdk import AbstractService, DynamoArgumentParser, abstract_endpoint, depends, endpoint, service
from dynamo.sdk.cli.gpus import GpuAllocationError, GpuAllocator
from dynamo.sdk.lib.config import ServiceConfig, ServiceConfigError
from dynamo.sdk.lib.overrides import deep_merge, parse_overrides
from helpers import EXAMPLES_DIR

GRAPHS = Path(__file__).parent / "sdk_graphs"
CLI_TIMEOUT = 60


@pytest.fixture(autouse=True)
def fresh_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test starts without a loaded configuration or one in the environment."""
    monkeypatch.delenv("DYNAMO_SERVICE_CONFIG", raising=False)
    monkeypatch.delenv("DYN_DEPLOYMENT_CONFIG", raising=False)
    ServiceConfig.reset()
    yield
    ServiceConfig.reset()


def dynamo_cli(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """Run the `dynamo` command (as its console script does) and capture its output."""
    import os

    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("DYN_", "DYNAMO_"))}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-m", "dynamo.sdk.cli.main", *args],
        cwd=cwd, env=full_env, capture_output=True, text=True, timeout=CLI_TIMEOUT,
    )


def dry_run_config(done: subprocess.CompletedProcess) -> dict:
    """The effective configuration JSON a `--dry-run` printed."""
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout.split("Service Configuration:\n", 1)[1]
    return json.loads(text.split("\nEnvironment Variable that would be set:", 1)[0])


# --------------------------------------------------------------------- ServiceConfig


def test_require_names_service_and_key():
    config = ServiceConfig({"MyService": {"model_name": "m"}})
    assert config.require("MyService", "model_name") == "m"
    with pytest.raises(ServiceConfigError, match=r"MyService\.api_key must be specified"):
        config.require("MyService", "api_key")
    with pytest.raises(ServiceConfigError, match=r"Other\.x"):
        config.require("Other", "x")


def test_as_args_flags_json_and_prefix():
    config = ServiceConfig(
        {
            "Worker": {
                "model": "m",
                "enforce-eager": True,
                "disabled": False,
                "nothing": None,
                "overrides": {"a": 1},
                "sizes": [1, 2],
                "lib_option1": "value1",
                "ServiceArgs": {"workers": 2},
            }
        }
    )
    assert config.as_args("Worker") == [
        "--model", "m", "--enforce-eager", "--overrides", '{"a": 1}', "--sizes", "[1, 2]",
        "--lib_option1", "value1",
    ]
    assert config.as_args("Worker", prefix="lib_") == ["--option1", "value1"]


def test_as_args_with_common_section():
    config = ServiceConfig(
        {
            "Common": {"block-size": 64, "model": "shared-model", "max-model-len": 16384},
            "Prefill": {"common-configs": ["block-size", "model"], "block-size": 128},
            "Decode": {"common-configs": ["model", "max-model-len"]},
            "Other": {"x": 1},
        }
    )
    # Subscribed Common keys come first; a local value overrides the Common one.
    assert config.as_args("Prefill") == ["--block-size", "128", "--model", "shared-model"]
    assert config.as_args("Decode") == ["--model", "shared-model", "--max-model-len", "16384"]
    # Without common-configs, nothing from Common.
    assert config.as_args("Other") == ["--x", "1"]


def test_get_instance_reads_the_environment(monkeypatch):
    monkeypatch.setenv("DYNAMO_SERVICE_CONFIG", json.dumps({"A": {"k": 1}}))
    assert ServiceConfig.get_instance().require("A", "k") == 1
    ServiceConfig.reset()
    monkeypatch.setenv("DYNAMO_SERVICE_CONFIG", "{not json")
    with pytest.raises(ServiceConfigError, match="not valid JSON"):
        ServiceConfig.get_instance()


# --------------------------------------------------------------------- overrides


def test_overrides_nested_json_and_strings():
    overrides, rest = parse_overrides(
        [
            "--A.b=1",
            "--A.c", "text",
            "--A.ServiceArgs.workers=4",
            "--A.ServiceArgs.resources.gpu", "2",
            "--A.ServiceArgs.envs.TOKEN=123",
            "--A.flag",
            "--B.obj={\"k\": [1, 2]}",
            "--B.neg", "-1.5",
            "positional",
            "--plain",
        ]
    )
    assert overrides == {
        "A": {
            "b": 1,
            "c": "text",
            "ServiceArgs": {"workers": 4, "resources": {"gpu": 2}, "envs": {"TOKEN": "123"}},
            "flag": True,
        },
        "B": {"obj": {"k": [1, 2]}, "neg": -1.5},
    }
    assert rest == ["positional", "--plain"]


def test_overrides_for_a_standalone_component():
    overrides, rest = parse_overrides(
        ["--message", "hi", "--ServiceArgs.workers=2", "--Other.x=1"], default_service="Me", known_services=["Other"]
    )
    assert overrides == {"Me": {"message": "hi", "ServiceArgs": {"workers": 2}}, "Other": {"x": 1}}
    assert rest == []


def test_deep_merge_keeps_sibling_keys():
    base = {"S": {"ServiceArgs": {"workers": 8, "resources": {"gpu": 4}}, "a": 1}}
    merged = deep_merge(base, {"S": {"ServiceArgs": {"workers": 2}}})
    assert merged == {"S": {"ServiceArgs": {"workers": 2, "resources": {"gpu": 4}}, "a": 1}}
    assert base["S"]["ServiceArgs"]["workers"] == 8  # inputs untouched


# --------------------------------------------------------------------- precedence


@pytest.mark.parametrize("variable", ["DYN_SDK_STOP_TIMEOUT", "DYN_SDK_READY_TIMEOUT"])
def test_a_bound_that_is_not_seconds_is_a_clear_error(variable):
    done = dynamo_cli(["serve", "llm_service:LLMService", "-f", "prod_config.yaml", "--dry-run"], cwd=GRAPHS,
                      **{variable: "soon"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{variable} must be a number of seconds >= 0, got 'soon'" in done.stderr
    assert "Traceback" not in done.stderr


def test_complete_configuration_example_dry_run():
    """The seed: `dynamo serve service:LLMService -f prod_config.yaml --LLMService.temperature=0.9`."""
    done = dynamo_cli(
        ["serve", "llm_service:LLMService", "-f", "prod_config.yaml", "--LLMService.temperature=0.9", "--dry-run"],
        cwd=GRAPHS,
        DYN_SDK_GPU_COUNT="32",
    )
    effective = dry_run_config(done)["LLMService"]
    args = effective.pop("ServiceArgs")
    assert args["dynamo"]["namespace"] == "prod"
    assert args["resources"]["gpu"] == 4
    assert args["workers"] == 8
    assert effective == {
        "model_name": "llama-3-70b-instruct",
        "temperature": 0.9,
        "max_tokens": 2048,
        "cache_size": 10000,
        "use_kv_cache": True,
    }
    # 8 workers x 4 GPUs, assigned in order.
    assert "LLMService[0]: 0,1,2,3" in done.stdout and "LLMService[7]: 28,29,30,31" in done.stdout


def test_complete_configuration_example_instance(monkeypatch):
    """The instance the service process builds gets the same values."""
    from dynamo.sdk.lib.overrides import load_config_file

    sys.path.insert(0, str(GRAPHS))
    try:
        from llm_service import LLMService
    finally:
        sys.path.remove(str(GRAPHS))
    overrides, _ = parse_overrides(["--LLMService.temperature=0.9"])
    ServiceConfig.set_instance(deep_merge(load_config_file(GRAPHS / "prod_config.yaml"), overrides))
    instance = LLMService(**LLMService.constructor_kwargs())
    assert (instance.model_name, instance.temperature, instance.max_tokens) == ("llama-3-70b-instruct", 0.9, 2048)
    assert (instance.cache_size, instance.use_kv_cache) == (10000, True)
    assert LLMService.dynamo_address() == ("prod", "LLMService")
    args = LLMService.service_args()
    assert (args.workers, args.resources["gpu"], args.resources["memory"]) == (8, 4, "64Gi")


def test_precedence_each_level():
    @service(dynamo={"namespace": "deco"}, resources={"gpu": 1, "cpu": "2"}, workers=3)
    class Svc:
        def __init__(self, a: int = 1, b: str = "ctor", c: float = 0.5):
            self.a, self.b, self.c = a, b, c

    yaml_level = {"Svc": {"b": "yaml", "c": 0.7, "ServiceArgs": {"workers": 5, "resources": {"gpu": 2}}}}
    cli_level, _ = parse_overrides(["--Svc.c=0.9", "--Svc.ServiceArgs.workers=7"])
    config = deep_merge(yaml_level, cli_level)
    effective = Svc.effective_config(config)
    # constructor default < YAML < CLI
    assert (effective["a"], effective["b"], effective["c"]) == (1, "yaml", 0.9)
    # decorator < YAML < CLI, merged key by key
    assert effective["ServiceArgs"]["workers"] == 7
    assert effective["ServiceArgs"]["resources"] == {"gpu": 2, "cpu": "2"}
    assert effective["ServiceArgs"]["dynamo"]["namespace"] == "deco"


def test_wrong_types_are_clear_errors():
    @service(dynamo={"namespace": "t"})
    class Typed:
        def __init__(self, temperature: float = 0.7, name: str = "x", count=3):
            pass

    with pytest.raises(ServiceConfigError, match=r"Typed\.temperature"):
        Typed.constructor_kwargs({"Typed": {"temperature": "hot"}})
    with pytest.raises(ServiceConfigError, match=r"Typed\.count"):
        Typed.constructor_kwargs({"Typed": {"count": "three"}})
    # A number given for a string parameter is the string a user typed.
    assert Typed.constructor_kwargs({"Typed": {"name": 123}}) == {"name": "123"}
    with pytest.raises(ServiceConfigError, match=r"Typed\.ServiceArgs\.workers"):
        Typed.service_args({"Typed": {"ServiceArgs": {"workers": "many"}}})
    with pytest.raises(ServiceConfigError, match=r"Typed\.ServiceArgs\.wrkers"):
        Typed.service_args({"Typed": {"ServiceArgs": {"wrkers": 2}}})
    with pytest.raises(ServiceConfigError, match=r"ServiceArgs\.dynamo\.namespace"):
        Typed.service_args({"Typed": {"ServiceArgs": {"dynamo": {"namespace": ["a"]}}}})


def test_bad_decorator_fails_at_import():
    with pytest.raises(ServiceConfigError, match="workers"):

        @service(workers=0)
        class Bad:
            pass


def test_dry_run_errors_exit_non_zero():
    cases = [
        (["--LLMService.temperature=hot"], "LLMService.temperature"),
        (["--LLMService.ServiceArgs.workers=many"], "LLMService.ServiceArgs.workers"),
        (["--LLMServce.temperature=1"], "unknown service"),
        (["stray"], "unexpected arguments"),
    ]
    for extra, message in cases:
        done = dynamo_cli(
            ["serve", "llm_service:LLMService", "--dry-run", *extra], cwd=GRAPHS, DYN_DISABLE_AUTO_GPU_ALLOCATION="1"
        )
        assert done.returncode == 2, (extra, done.stdout, done.stderr)
        assert message in done.stderr, (extra, done.stderr)
    missing = dynamo_cli(["serve", "llm_service:LLMService", "-f", "nope.yaml", "--dry-run"], cwd=GRAPHS)
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


def test_argument_parser_same_config_alone_and_under_serve(tmp_path, monkeypatch):
    config_file = tmp_path / "c.yaml"
    config_file.write_text("Worker:\n  suffix: from-yaml\n  repeat: 2\n")
    parser = DynamoArgumentParser("Worker")
    parser.add_argument("--suffix", default="!")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args(["-f", str(config_file), "--repeat", "5", "--extra-key", "x"])
    assert (args.suffix, args.repeat) == ("from-yaml", 5)  # flag > YAML > declared default
    assert ServiceConfig.get_instance()["Worker"]["extra-key"] == "x"
    # Under serve: the same keys arrive in DYNAMO_SERVICE_CONFIG.
    monkeypatch.setenv("DYNAMO_SERVICE_CONFIG", json.dumps({"Worker": {"suffix": "from-env", "model-path": "/m"}}))
    parser = DynamoArgumentParser("Worker")
    parser.add_argument("--suffix", default="!")
    parser.add_argument("--model-path", default=None)
    args = parser.parse_args([])
    assert (args.suffix, args.model_path) == ("from-env", "/m")


# --------------------------------------------------------------------- graphs


def _pipeline():
    @service(dynamo={"namespace": "inference"})
    class Backend:
        @endpoint()
        async def generate(self, text: str) -> AsyncIterator[str]:
            yield text

        @endpoint("generate_v2")
        async def generate2(self, text: str) -> AsyncIterator[str]:
            yield text

    @service(dynamo={"namespace": "inference"})
    class Backend2:
        @endpoint()
        async def generate(self, text: str) -> AsyncIterator[str]:
            yield text

    @service(dynamo={"namespace": "inference"})
    class Middle:
        backend = depends(Backend)
        backend2 = depends(Backend2)

    @service(dynamo={"namespace": "inference"})
    class Frontend:
        middle = depends(Middle)
        backend = depends(Backend)

    return Frontend, Middle, Backend, Backend2


def test_depends_builds_the_graph_and_link_prunes_it():
    frontend, middle, backend, _ = _pipeline()
    assert [s.name for s in frontend.all_services()] == ["Backend", "Backend2", "Middle", "Frontend"]
    assert backend.endpoint_names() == ["generate", "generate_v2"]
    assert frontend.link(middle).link(backend) is backend
    assert set(frontend.used_dependencies()) == {"middle"}
    assert set(middle.used_dependencies()) == {"backend"}
    assert [s.name for s in frontend.all_services()] == ["Backend", "Middle", "Frontend"]
    with pytest.raises(ValueError, match="no dependency"):
        backend.link(frontend)


def test_seed_processor_link_router():
    @service(dynamo={"namespace": "d"})
    class VllmWorker:
        @endpoint()
        async def generate(self, r: str) -> AsyncIterator[str]:
            yield r

    @service(dynamo={"namespace": "d"})
    class Router:
        @endpoint()
        async def generate(self, r: str) -> AsyncIterator[str]:
            yield r

    @service(dynamo={"namespace": "d"})
    class Processor:
        worker = depends(VllmWorker)
        router = depends(Router)

    assert {s.name for s in Processor.all_services()} == {"VllmWorker", "Router", "Processor"}
    Processor.link(Router)
    assert {s.name for s in Processor.all_services()} == {"Router", "Processor"}


def test_abstract_services():
    class WorkerInterface(AbstractService):
        @abstract_endpoint
        async def generate(self, request: str):
            pass

    with pytest.raises(TypeError, match=r"does not implement \['generate'\]"):

        @service(dynamo={"namespace": "a"})
        class Lazy(WorkerInterface):
            pass

    with pytest.raises(TypeError, match=r"without @endpoint"):

        @service(dynamo={"namespace": "a"})
        class Undecorated(WorkerInterface):
            async def generate(self, request: str):
                yield request

    @service(dynamo={"namespace": "a"})
    class Impl(WorkerInterface):
        @endpoint()
        async def generate(self, request: str):
            yield request

    @service(dynamo={"namespace": "a"})
    class Front:
        worker = depends(WorkerInterface)

    with pytest.raises(RuntimeError, match=r"Front\.worker depends on the interface WorkerInterface.*\.link"):
        Front.all_services()
    Front.link(Impl)
    assert [s.name for s in Front.all_services()] == ["Impl", "Front"]


def test_llm_hello_world_example_graph():
    done = dynamo_cli(["serve", "llm_hello_world:Frontend", "--dry-run"], cwd=EXAMPLES_DIR / "llm_hello_world")
    assert list(dry_run_config(done)) == ["SpongeWorker", "FastRouter", "Frontend"]


# --------------------------------------------------------------------- GPUs


def test_gpu_allocator():
    gpus = GpuAllocator(4)
    assert gpus.assign("A[0]", 2) == [0, 1]
    assert gpus.assign("B[0]", 0.5) == [2]
    assert gpus.assign("B[1]", 0.5) == [2]  # fractions share a GPU
    assert gpus.assign("C[0]", 0.25) == [3]
    assert gpus.assign("C[1]", 0) == []
    with pytest.raises(GpuAllocationError, match=r"A\[1\] asks for 1 GPU\(s\) per process but this machine has 4"):
        gpus.assign("A[1]", 1)
    with pytest.raises(GpuAllocationError, match="whole number"):
        GpuAllocator(4).assign("X", 1.5)


def test_gpu_assignment_in_the_plan():
    done = dynamo_cli(["serve", "gpu_graph:Whole", "--dry-run"], cwd=GRAPHS, DYN_SDK_GPU_COUNT="3")
    assert done.returncode == 0, done.stderr
    assert "Half[0]: 0, Half[1]: 0" in done.stdout
    assert "Whole[0]: 1, Whole[1]: 2" in done.stdout
    short = dynamo_cli(["serve", "gpu_graph:Whole", "--dry-run"], cwd=GRAPHS, DYN_SDK_GPU_COUNT="2")
    assert short.returncode == 2 and "Whole[1] asks for 1 GPU(s)" in short.stderr, short.stderr
    disabled = dynamo_cli(
        ["serve", "gpu_graph:Whole", "--dry-run"], cwd=GRAPHS, DYN_SDK_GPU_COUNT="0",
        DYN_DISABLE_AUTO_GPU_ALLOCATION="1",
    )
    assert disabled.returncode == 0 and "CUDA_VISIBLE_DEVICES {Whole[0]: -" in disabled.stdout
    elsewhere = dynamo_cli(["serve", "gpu_graph:Whole", "--depends", "Half=tcp://other:1", "--dry-run"], cwd=GRAPHS,
                           DYN_SDK_GPU_COUNT="2")
    assert elsewhere.returncode == 0 and list(dry_run_config(elsewhere)) == ["Whole"], elsewhere.stderr
    only = dynamo_cli(["serve", "gpu_graph:Whole", "--service-name", "Half", "--dry-run"], cwd=GRAPHS,
                      DYN_SDK_GPU_COUNT="1")
    assert only.returncode == 0 and list(dry_run_config(only)) == ["Half"]


# --------------------------------------------------------------------- seeds


def test_seed_config_samples(monkeypatch):
    sys.path.insert(0, str(GRAPHS))
    try:
        import seed_samples
    finally:
        sys.path.remove(str(GRAPHS))
    config = {
        "MyService": {
            "api_key": "k",
            "temperature": 0.8,
            "lib_option1": "value1",
            "lib_flag2": True,
            "lib_option3": "value3",
            "ServiceArgs": {"workers": 4},
        }
    }
    monkeypatch.setenv("DYNAMO_SERVICE_CONFIG", json.dumps(config))
    ServiceConfig.reset()
    svc = seed_samples.MyService()
    assert (svc.model_name, svc.temperature, svc.api_key) == ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 0.8, "k")
    assert ServiceConfig.get_instance().as_args("MyService", prefix="lib_") == [
        "--option1", "value1", "--flag2", "--option3", "value3"
    ]
    assert seed_samples.setup_my_lib() == argparse.Namespace(option1="value1", flag2=True, option3="value3")
    assert seed_samples._get_service_args(None, "MyService") == {"workers": 4}
    ServiceConfig.set_instance({"MyService": {}})
    with pytest.raises(ValueError, match=r"MyService\.api_key"):
        seed_samples.MyService()


"""The planner's configuration: defaults, flags over the file, and errors that name the key."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from dynamo.planner.__main__ import performance_model
from dynamo.planner.config import LocalConnectorConfig, PlannerConfigError, build_config, load_config
from dynamo.planner.profile import DisaggModel, PerformanceModel, ProfileError


def test_a_file_with_flags_on_top(tmp_path: Path) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text(
        "model: m\n"
        "targets:\n  ttft: {quantile: 0.95, ms: 400}\n  itl: {ms: 30}\n"
        "gpu_budget: 6\n"
        "roles:\n  prefill: {max_replicas: 2, gpus_per_replica: 2}\n  decode: {max_replicas: 4}\n"
        "intervals: {throughput_s: 30, load_s: 5}\n"
        "connector: {kind: virtual, report_timeout_s: 9}\n"
    )
    config = load_config(path, {"targets.ttft.ms": 300, "advisory": True})
    assert (config.targets.ttft.quantile, config.targets.ttft.ms) == (0.95, 300)
    assert (config.targets.itl.quantile, config.targets.itl.ms) == (0.9, 30)
    assert config.advisory and config.gpu_budget == 6
    assert config.roles["prefill"].gpus_per_replica == 2 and config.roles["decode"].max_replicas == 4
    assert (config.intervals.throughput_s, config.intervals.load_s) == (30, 5)
    assert config.connector.kind == "virtual" and config.connector.report_timeout_s == 9


def test_defaults_need_only_the_model() -> None:
    config = build_config({"model": "m"})
    assert list(config.roles) == ["agg"] and isinstance(config.connector, LocalConnectorConfig)
    assert config.targets.ttft.ms == 500 and not config.advisory


@pytest.mark.parametrize(
    ("data", "names"),
    [
        ({"model": "m", "targets": {"ttft": {"ms": "fast"}}}, ["targets.ttft.ms", "'fast'"]),
        ({"model": "m", "intervals": {"load_s": [1]}}, ["intervals.load_s"]),
        ({"model": "m", "roles": {"agg": {"max_replicas": "many"}}}, ["roles.agg.max_replicas"]),
        ({"model": "m", "connector": {"kind": "local", "startup_delay_s": "soon"}}, ["connector.startup_delay_s"]),
        ({"model": "m", "tragets": {}}, ["tragets", "Extra inputs"]),
        ({}, ["model", "Field required"]),
        ({"model": "m", "roles": {"prefill": {}}}, ["'agg', or 'prefill' and 'decode'"]),
        ({"model": "m", "roles": {"agg": {"min_replicas": 0}}}, ["scale_to_zero is false"]),
        ({"model": "m", "roles": {"agg": {"min_replicas": 3, "max_replicas": 2}}}, ["min_replicas (3)"]),
        ({"model": "m", "gpu_budget": 1, "roles": {"agg": {"min_replicas": 2}}}, ["over gpu_budget"]),
    ],
)
def test_a_wrong_key_is_named(data: dict, names: list[str]) -> None:
    with pytest.raises(PlannerConfigError) as error:
        build_config(data)
    for name in names:
        assert name in str(error.value)


def test_a_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "planner.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(PlannerConfigError, match="must be a mapping"):
        load_config(path)


def test_the_documented_example_is_valid() -> None:
    """The configuration block of docs/planner.md parses, as written."""
    import yaml

    text = (Path(__file__).parent.parent / "docs" / "planner.md").read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = build_config(yaml.safe_load(block))
    assert config.model == "tiny-words" and config.roles["agg"].command[:3] == ["python", "-m", "dynamo.mocker"]
    assert config.predictor.warm_start == [2.0, 2.5, 3.1] and config.connector.kind == "local"


def _profile(path: Path, role: str, ttft_ms: float, itl_ms: float) -> Path:
    points = [{"isl": 1000, "concurrency": c, "ttft_ms": ttft_ms * c, "itl_ms": itl_ms * c, "throughput_rps": 2.0 * c}
              for c in (1, 2, 4)]
    path.write_text(json.dumps({"engine": "test", "role": role, "points": points}))
    return path


def test_each_role_is_sized_from_its_own_workers_profile(tmp_path: Path, caplog) -> None:
    prefill = _profile(tmp_path / "prefill.json", "prefill", ttft_ms=100.0, itl_ms=0.0)
    decode = _profile(tmp_path / "decode.json", "decode", ttft_ms=10.0, itl_ms=10.0)
    agg = _profile(tmp_path / "agg.json", "agg", ttft_ms=200.0, itl_ms=20.0)
    roles = {"prefill": {"profile": str(prefill)}, "decode": {"profile": str(decode)}}
    model = performance_model(build_config({"model": "m", "roles": roles}))
    assert isinstance(model, DisaggModel)
    # Prefill capacity from the prefill worker (TTFT 200 ms at concurrency 2: 4 req/s), decode
    # capacity from the decode worker (ITL 20 ms at concurrency 2: 4 req/s), not the aggregated one's.
    assert model.capacity(1000, 200.0, None) == pytest.approx(4.0)
    assert model.capacity(1000, None, 20.0) == pytest.approx(4.0)
    # A role without its own profile takes the top-level one, with a warning that it oversizes.
    caplog.set_level(logging.WARNING, "dynamo.planner")
    mixed = build_config({"model": "m", "profile": str(agg), "roles": {"prefill": {"profile": str(prefill)},
                                                                         "decode": {}}})
    model = performance_model(mixed)
    assert isinstance(model, DisaggModel)
    assert model.capacity(1000, None, 20.0) == pytest.approx(2.0)  # the aggregated worker's ITL
    assert "role 'decode' is sized from an aggregated worker's profile" in caplog.text
    # An aggregated fleet reads the top-level profile; no profile at all: no model.
    assert type(performance_model(build_config({"model": "m", "profile": str(agg)}))) is PerformanceModel
    assert performance_model(build_config({"model": "m"})) is None


def test_a_profile_of_the_wrong_role_or_a_role_without_one_is_refused(tmp_path: Path) -> None:
    prefill = _profile(tmp_path / "prefill.json", "prefill", ttft_ms=100.0, itl_ms=0.0)
    swapped = {"prefill": {"profile": str(prefill)}, "decode": {"profile": str(prefill)}}
    with pytest.raises(ProfileError, match="a prefill worker's profile, given for role 'decode'"):
        performance_model(build_config({"model": "m", "roles": swapped}))
    with pytest.raises(ProfileError, match="given for role 'agg'"):
        performance_model(build_config({"model": "m", "profile": str(prefill)}))
    with pytest.raises(PlannerConfigError, match=r"roles\.decode\.profile is not set and there is no top-level"):
        build_config({"model": "m", "roles": {"prefill": {"profile": str(prefill)}, "decode": {}}})

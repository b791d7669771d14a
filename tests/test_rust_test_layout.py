"""Each Rust crate builds its integration tests as one binary (`autotests = false`, one
`[[test]]`: `tests/integration.rs`), so cargo no longer finds a test file by itself. A
file under `tests/` that `integration.rs` does not name would never be compiled, and
its tests would never run: every one must be named, and every name must be a file."""

from __future__ import annotations

import re

import pytest
import tomllib
from helpers import REPO_ROOT

CRATES = sorted(path.parent for path in (REPO_ROOT / "lib").glob("*/Cargo.toml"))


def declared_modules(root: str) -> set[str]:
    """The modules a crate root declares (`mod name;`, with or without `#[path]`)."""
    return set(re.findall(r"^\s*mod\s+(\w+)\s*;", root, flags=re.MULTILINE))


def path_modules(root: str) -> dict[str, str]:
    """The modules a crate root declares at a path of their own: name → path."""
    found = re.findall(r'^\s*#\[path\s*=\s*"([^"]+)"\]\s*mod\s+(\w+)\s*;', root, flags=re.MULTILINE)
    return {name: path for path, name in found}


@pytest.mark.parametrize("crate", CRATES, ids=lambda path: path.name)
def test_every_test_file_is_in_the_crates_one_integration_binary(crate) -> None:
    manifest = tomllib.loads((crate / "Cargo.toml").read_text())
    tests = crate / "tests"
    if not tests.is_dir():
        pytest.skip(f"{crate.name} has no integration tests")
    assert manifest["package"].get("autotests") is False, f"{crate.name}: autotests is not false"
    assert [t["path"] for t in manifest.get("test", [])] == ["tests/integration.rs"], manifest.get("test")
    files = {p.stem for p in tests.glob("*.rs")} - {"integration"}
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "mod.rs").exists()}
    root = (tests / "integration.rs").read_text()
    declared, at_paths = declared_modules(root), path_modules(root)
    assert files, f"{crate.name}: no test files"
    assert files <= declared, f"{crate.name}: test files not named in tests/integration.rs: {sorted(files - declared)}"
    # The rest are helper folders, or modules at a path of their own that exists.
    unknown = declared - files - folders - set(at_paths)
    assert not unknown, f"{crate.name}: tests/integration.rs names modules with no file: {sorted(unknown)}"
    missing = {name: path for name, path in at_paths.items() if not (tests / path).is_file()}
    assert not missing, f"{crate.name}: tests/integration.rs points at no file: {missing}"


def test_an_unnamed_test_file_is_caught() -> None:
    # The check above reads `mod name;` lines, and a file whose name is missing from
    # them is reported.
    root = "mod common;\n#[path = \"../x/mod.rs\"]\nmod poll;\n\nmod batch;\n"
    assert declared_modules(root) == {"common", "poll", "batch"}
    assert path_modules(root) == {"poll": "../x/mod.rs"}
    assert {"batch", "cli"} - declared_modules(root) == {"cli"}

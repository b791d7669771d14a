#!/usr/bin/env bash
# The whole test suite, set up by itself: the test tools, vLLM for the CPU and etcd/NATS
# installed (scripts/install-test-deps.sh), the README's quick start run as a user would
# (scripts/check-quickstart.sh), the Rust tests, the extension built and installed into
# the current Python, the stub check, the linter, then the Python tests (the real-engine
# tier included). Run from anywhere: bash scripts/test.sh [pytest args]. CI runs exactly
# this (.ci/run).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dynamo-target}"
PYTHON="${PYTHON:-python}"

# Each step's wall time is printed when the next one starts, and all of them at the end
# (where CI's time goes).
timings=()
current=""
started=$SECONDS
step_done() {
    if [ -n "$current" ]; then
        timings+=("$(printf '%5ds  %s' "$((SECONDS - started))" "$current")")
        printf '(%ds)\n' "$((SECONDS - started))"
    fi
}
step() { step_done; current="$*"; started=$SECONDS; printf '\n==> %s\n' "$*"; }
report_timings() {
    step_done
    current=""
    printf '\n==> wall time per step\n'
    printf '%s\n' "${timings[@]}"
}

step "test dependencies (scripts/install-test-deps.sh)"
bash scripts/install-test-deps.sh

step "README quick start: pip install -v . && dynamo-run ..., in a fresh virtual environment"
# Release build, cached in $CARGO_TARGET_DIR between runs; bounded (40 min).
bash scripts/check-quickstart.sh

step "cargo test (workspace, without the extension crate)"
# The bindings crate links against libpython only when loaded by Python, so it is
# built by maturin below rather than tested here.
cargo test --workspace --exclude dynamo-py

step "build and install the extension (dev profile)"
wheel_dir="$(mktemp -d)"
trap 'rm -rf "$wheel_dir"' EXIT
maturin build --profile dev --interpreter "$PYTHON" --out "$wheel_dir"
"$PYTHON" -m pip install --quiet --force-reinstall --no-deps "$wheel_dir"/*.whl
# ...and whatever it depends on that is not installed yet (pyyaml, fastapi, uvicorn, pydantic).
"$PYTHON" -m pip install --quiet "$wheel_dir"/*.whl

step "stub check: python/dynamo/_core.pyi against the extension"
"$PYTHON" -m mypy.stubtest dynamo._core --allowlist scripts/stubtest-allowlist.txt

step "lint: ruff"
"$PYTHON" -m ruff check python tests examples benches

step "python tests"
status=0
"$PYTHON" -m pytest -q "$@" || status=$?
report_timings
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests; nothing failed"
    status=0
fi
exit "$status"

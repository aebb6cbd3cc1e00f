#!/usr/bin/env bash
# Installs SteadyFrame into the active Python environment: runs scripts/install.py (the installer, in Python so
# that Windows has the same one: `python scripts\install.py`), which picks the PyTorch build for the machine when
# none is installed (an installed one is always kept), then runs `pip install -e .` (console scripts `steadyframe`
# and `steadyframe-cli`).
#
#   bash scripts/install.sh                # the app
#   bash scripts/install.sh --dev          # the app + test tools (`pip install -e .[dev]`)
#   bash scripts/install.sh --dry-run      # what it found and would run; runs nothing
#   bash scripts/install.sh --help         # the options (--torch cpu|cuda|rocm|keep, --cuda, --rocm, ...)
#
# PYTHON picks the interpreter (default: `python`, the active environment's).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then
    exec "$PYTHON" scripts/install.py --python "$PYTHON" "$@"
fi
exec python scripts/install.py "$@"

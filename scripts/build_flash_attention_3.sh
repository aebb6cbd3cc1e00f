#!/usr/bin/env bash
# Builds FlashAttention-3's fp8 forward for SteadyFrame's "fp8 attention" setting and installs it into the active
# Python environment (the package `flash_attn_3` with its module `flash_attn_interface`; rocm/fp8_attention.py
# takes it where it is installed, on Hopper GPUs: H100/H200). FlashAttention-3 is not on PyPI: this builds it from
# the flash-attention repository's `hopper/` folder, pinned to the commit measured in BENCHMARKS.md, with every
# kernel this model never runs switched off (no backward, head size 128 only, no paged/split/varlen/local/softcap
# variants), so the build takes ~2 minutes on 16 cores instead of hours.
#
#   bash scripts/build_flash_attention_3.sh              # clone (or reuse) into ~/.cache/steadyframe, build, install
#   bash scripts/build_flash_attention_3.sh --dry-run    # print what it would run; runs nothing
#   FA3_DIR=/path bash scripts/build_flash_attention_3.sh   # another checkout folder
#
# Needs: git, CUDA's compiler (nvcc 12.3 or newer: 13.0 measured; with CUDA 12.x other than 12.8 the build fetches
# NVIDIA's nvcc 12.6 and ptxas 12.8, as flash-attention's setup does), a C++ compiler, and PyTorch installed with
# CUDA. MAX_JOBS (default: the cores) and NVCC_THREADS (default 4) set the build's parallelism.
set -euo pipefail
COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced        # flash-attention main, 2026-08-15 (built and measured)
REPO=https://github.com/Dao-AILab/flash-attention.git
FA3_DIR=${FA3_DIR:-${HOME}/.cache/steadyframe/flash-attention}
PYTHON=${PYTHON:-python}
OFF="BACKWARD SPLIT PAGEDKV APPENDKV LOCAL SOFTCAP PACKGQA FP16 CLUSTER VARLEN HDIM64 HDIM96 HDIM192 HDIM256 SM80
     HDIMDIFF64 HDIMDIFF192"
DRY=0
case "${1:-}" in
    --dry-run) DRY=1 ;;
    --help|-h) sed -n '2,17p' "$0"; exit 0 ;;
    "") ;;
    *) echo "build_flash_attention_3.sh: unknown option '$1' (--dry-run, --help)" >&2; exit 2 ;;
esac
for f in $OFF; do export "FLASH_ATTENTION_DISABLE_$f=TRUE"; done
export MAX_JOBS=${MAX_JOBS:-$(nproc 2>/dev/null || echo 4)} NVCC_THREADS=${NVCC_THREADS:-4}
export FLASH_ATTENTION_FORCE_BUILD=TRUE        # these flags, not a prebuilt wheel of other ones
run() { echo "+ $*"; if [ "$DRY" = 0 ]; then "$@"; fi; }

echo "FlashAttention-3 (fp8 forward, head size 128) at $COMMIT into $FA3_DIR"
env | grep '^FLASH_ATTENTION_DISABLE_' | sort
echo "MAX_JOBS=$MAX_JOBS NVCC_THREADS=$NVCC_THREADS"
if [ "$DRY" = 0 ]; then
    command -v nvcc >/dev/null || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ] || {
        echo "build_flash_attention_3.sh: CUDA's compiler (nvcc) was not found: install the CUDA toolkit (12.3 or" \
             "newer) or set CUDA_HOME" >&2; exit 2; }
    "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" || {
        echo "build_flash_attention_3.sh: this Python's PyTorch has no CUDA: FlashAttention-3 is for NVIDIA" \
             "Hopper GPUs" >&2; exit 2; }
fi
if [ ! -d "$FA3_DIR/.git" ]; then
    run git clone --filter=blob:none "$REPO" "$FA3_DIR"
fi
run git -C "$FA3_DIR" fetch --quiet origin "$COMMIT"
run git -C "$FA3_DIR" checkout --quiet "$COMMIT"
run git -C "$FA3_DIR" submodule update --init csrc/cutlass
cd "$FA3_DIR/hopper" 2>/dev/null || [ "$DRY" = 1 ]
run "$PYTHON" -m pip install --no-build-isolation --no-deps .
run "$PYTHON" -c "import flash_attn_interface; print('FlashAttention-3 installed:', flash_attn_interface.__file__)"

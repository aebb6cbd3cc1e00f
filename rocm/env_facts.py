"""What MIOpen/ROCr/PyTorch variables exist and which values they take, from docs/FACTS.md (ROCm) only.

Pure data plus one parser; used by ``rocm.env.check_environment``.
"""

from __future__ import annotations

FIND_MODE_VALUES = {"NORMAL": 1, "FAST": 2, "HYBRID": 3, "DYNAMIC_HYBRID": 5, "TRUST_VERIFY": 6,
                    "TRUST_VERIFY_FULL": 7}
FIND_ENFORCE_VALUES = {"NONE": 1, "DB_UPDATE": 2, "SEARCH": 3, "SEARCH_DB_UPDATE": 4, "DB_CLEAN": 5}

# Variables that circulate in field notes but that nothing reads.
NONEXISTENT = {
    "MIOPEN_FIND_TIME_LIMIT": "does not exist: nothing reads it. To avoid long searches use MIOPEN_FIND_MODE=2 "
                              "(FAST); MIOPEN_TUNING_TIME_MS_MAX / MIOPEN_TUNING_PATIENCE cap the tuning of one "
                              "solver only.",
    "MIOPEN_DEBUG_AMD_ROCM_PRECOMPILED_BINARIES": "was removed in ROCm 6.2: it does nothing.",
}

_XDLOPS = [f"MIOPEN_DEBUG_3D_CONV_IMPLICIT_GEMM_HIP_{d}_XDLOPS" for d in ("FWD", "BWD", "WRW")]
_NAIVE = [f"MIOPEN_DEBUG_CONV_DIRECT_NAIVE_CONV_{d}" for d in ("FWD", "BWD", "WRW")]
BOOL_VARS = frozenset(_XDLOPS + _NAIVE + [
    "MIOPEN_DEBUG_CONV_IMMED_FALLBACK", "MIOPEN_DEBUG_FORCE_IMMED_MODE_FALLBACK", "MIOPEN_DEBUG_CONV_IMPLICIT_GEMM",
    "MIOPEN_DEBUG_CONV_GEMM", "MIOPEN_DISABLE_CACHE", "MIOPEN_DEBUG_DISABLE_FIND_DB", "MIOPEN_ENABLE_LOGGING_CMD",
])
XDLOPS_VARS = frozenset(_XDLOPS)
# MIOpen's boolean parser (src/include/miopen/env.hpp, ParseEnvVal<bool>): these words, case-insensitive, exactly
# (no surrounding spaces); anything else throws miopenStatusInvalidValue.
BOOL_FALSE = frozenset({"0", "false", "off", "no", "disable", "disabled"})
BOOL_TRUE = frozenset({"1", "true", "on", "yes", "enable", "enabled"})
NAIVE_VARS = frozenset(_NAIVE)

OTHER_KNOWN_VARS = frozenset({
    "MIOPEN_FIND_MODE", "MIOPEN_FIND_ENFORCE", "MIOPEN_LOG_LEVEL", "MIOPEN_USER_DB_PATH", "MIOPEN_CUSTOM_CACHE_DIR",
    "MIOPEN_TUNING_TIME_MS_MAX", "MIOPEN_TUNING_PATIENCE", "HSA_OVERRIDE_GFX_VERSION",
    "PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF",
    "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL",
})
KNOWN_VARS = BOOL_VARS | OTHER_KNOWN_VARS | frozenset(NONEXISTENT)

ALLOC_BACKENDS = ("native", "hipMallocAsync", "cudaMallocAsync")


def miopen_bool(value: str) -> bool | None:
    """MIOpen's reading of a boolean variable: True, False, or None for a value it rejects."""
    v = value.lower()
    return True if v in BOOL_TRUE else (False if v in BOOL_FALSE else None)


def parse_alloc_conf(text: str) -> tuple[dict[str, str], list[str]]:
    """'k1:v1,k2:v2' -> ({k1: v1, k2: v2}, [malformed entries])."""
    entries, bad = {}, []
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition(":")
        if not sep or not key.strip():
            bad.append(item)
        else:
            entries[key.strip()] = value.strip()
    return entries, bad

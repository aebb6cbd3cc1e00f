"""ROCm environment profiles per AMD architecture family, as frozen data.

Read by ``rocm.env.apply_env_profile`` *before* ``import torch``; keep this file free of torch and of anything
heavy. Every variable named here must be a real, working switch according to ``docs/FACTS.md (ROCm)``
(tests/test_rocm_env.py checks that against an allow-list written from that page).

What each profile does and why:

* ``MIOPEN_FIND_MODE=2`` (FAST) on every family: use the find database on a hit, else MIOpen's immediate-mode
  fallback with no benchmarking. This is what fixed "first VAE decode takes minutes" in the field (84.5 s -> 7.2 s
  in one report) and what SD.Next and InvokeAI ship. Note that 1 is NORMAL, not FAST.
* The MIOpen kernel cache (``MIOPEN_CUSTOM_CACHE_DIR``) in SteadyFrame's cache folder, one per torch/ROCm build,
  created by ``rocm.env``; its path is computed at run time, so it is not listed here. ``MIOPEN_USER_DB_PATH`` is
  NOT set: under FIND_MODE=FAST MIOpen never writes the find database, so pointing it elsewhere only hides the
  user's own find-db (docs/FACTS.md, "How MIOpen reads its settings").
* ``TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL=1`` on the archs whose AOTriton flash / memory-efficient attention
  kernels PyTorch only offers behind that switch (consumer RDNA3/RDNA4, and gfx950): without it SDPA silently
  takes the math kernel, 29 GiB of scores at FramePack's ~18k tokens. PyTorch reads it, once, in
  ``check_flash_attention_hardware_support`` / ``check_mem_efficient_hardware_support``
  (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp, hipified for ROCm) through ``c10::utils::check_env``
  (c10/util/env.cpp: only "0" and "1" count), for the archs ``aotriton::isArchExperimentallySupported`` names:
  AOTriton's v2src/util.cc lists gfx950 and gfx1201 (0.9/0.10), later also gfx1151; PyTorch <= 2.6 gated gfx1100
  itself. The set moves between versions, so every gfx11xx/gfx12xx (and gfx950) gets it: where an arch is not
  gated, nothing reads the variable.
* Allocator: ``garbage_collection_threshold:0.8,max_split_size_mb:512`` (SD.Next's setting; both keys are read by
  ROCm builds of PyTorch). ``expandable_segments`` is left out: a no-op on ROCm before PyTorch 2.11 + ROCm 7.
* ``conv_tiers`` / ``conv3d_first_tier`` select where ``rocm.ConvFallback`` starts (1 MIOpen, 2 PyTorch's own GPU
  kernels with MIOpen off, 3 exact decomposition on the GPU, 4 the same with MIOpen off, 5 CPU fp32).
  - RDNA1 (gfx101x): no official wheel ships kernels for it and the usual HSA_OVERRIDE_GFX_VERSION=10.3.0 crashes
    (memory aperture violations), so convolutions stay off MIOpen: conv2d at tier 2, conv3d at tier 3 (2D convs
    over time, also without MIOpen: far smaller column buffers than tier 2's vol2col).
  - RDNA2, RDNA3, RDNA4 (gfx103x, gfx11xx, gfx12xx): MIOpen has no 3D heuristics and no fast 3D solver on these
    cards (its CK 3D implicit-GEMM solvers need XDLOPS: CDNA only); Hunyuan-shaped Conv3d measured at 44-71 s per
    call on a 7900 XTX. The exact rewrite of the causal 3D conv as 2D convs over time was reported 1.66x faster on
    gfx1100, so conv3d starts at tier 3 (its 2D convs still use MIOpen, which has 2D heuristics); when MIOpen fails
    or times out there (its first JIT compile after an upgrade included), tier 4 keeps that conv on the GPU without
    MIOpen before the CPU.
  - CDNA, unknown: MIOpen first (FAST find mode), with the fallback behind it.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

# The one allocator variable we set. Users may have set any of ALLOC_CONF_VARS; if so we set none (which of them
# wins differs between PyTorch versions, so adding ours could silently override theirs).
ALLOC_CONF_VAR = "PYTORCH_HIP_ALLOC_CONF"
ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
ALLOC_CONF_VALUE = "garbage_collection_threshold:0.8,max_split_size_mb:512"

# The MIOpen folder that rocm.env points into SteadyFrame's cache folder (the kernel cache only; see above).
MIOPEN_KERNEL_CACHE_VAR = "MIOPEN_CUSTOM_CACHE_DIR"

# AOTriton's opt-in for "experimental" archs, and the archs the profile sets it for (see the module docstring).
AOTRITON_EXPERIMENTAL_VAR = "TORCH_ROCM_AOTRITON_ENABLE_EXPERIMENTAL"
AOTRITON_EXPERIMENTAL_ARCH_PREFIXES = ("gfx11", "gfx12", "gfx950")


@dataclass(frozen=True)
class RocmProfile:
    """Environment and convolution defaults for one AMD architecture family."""

    family: str
    description: str
    env: Mapping[str, str]
    alloc_conf: str
    conv_tiers: tuple[int, ...]
    conv3d_first_tier: int
    vendor_convs_in_decomposition: bool
    notes: tuple[str, ...] = ()


def _profile(family: str, description: str, env: dict[str, str], *, conv_tiers=(1, 2, 3, 4, 5),
             conv3d_first_tier: int = 1, vendor_in_decomposition: bool = True, notes=()) -> RocmProfile:
    return RocmProfile(family=family, description=description, env=MappingProxyType(dict(env)),
                       alloc_conf=ALLOC_CONF_VALUE, conv_tiers=tuple(conv_tiers),
                       conv3d_first_tier=conv3d_first_tier,
                       vendor_convs_in_decomposition=vendor_in_decomposition, notes=tuple(notes))


# The convolution tiers (rocm.tiers runs them), in the order the fallback tries them.
NATIVE, VENDOR_OFF, DECOMPOSED, DECOMPOSED_VENDOR_OFF, CPU = TIERS = (1, 2, 3, 4, 5)
TIER_NAMES = {NATIVE: "native (MIOpen/cuDNN)", VENDOR_OFF: "GPU, MIOpen/cuDNN off", DECOMPOSED: "exact decomposition",
              DECOMPOSED_VENDOR_OFF: "exact decomposition, MIOpen/cuDNN off", CPU: "CPU fp32"}

_FAST = {"MIOPEN_FIND_MODE": "2"}  # 2 = FAST
_NO_3D_SOLVER = ("MIOpen has no 3D heuristics and no fast 3D solver on this card; 3D convs start at tier 3 (exact "
                 "2D decomposition, reported 1.66x faster decode on gfx1100).")

PROFILES: Mapping[str, RocmProfile] = MappingProxyType({
    "rdna1": _profile(
        "rdna1", "RDNA1 (gfx1010/gfx1011/gfx1012, RX 5000 series)", _FAST,
        conv_tiers=(2, 3, 5), conv3d_first_tier=3, vendor_in_decomposition=False,
        notes=("No official PyTorch wheel ships gfx101x kernels; HSA_OVERRIDE_GFX_VERSION=10.3.0 is widely "
               "reported to crash with memory aperture violations.",
               "Convolutions run without MIOpen: tier 2 (PyTorch's GPU kernels) for conv2d, tier 3 (2D convs "
               "over time, MIOpen off) for conv3d, CPU as the last resort.")),
    "rdna2": _profile(
        "rdna2", "RDNA2 (gfx103x, RX 6000 series)", _FAST, conv3d_first_tier=3, notes=(_NO_3D_SOLVER,)),
    "rdna3": _profile(
        "rdna3", "RDNA3 (gfx11xx, RX 7000 series, Radeon 780M/890M)", _FAST, conv3d_first_tier=3,
        notes=(_NO_3D_SOLVER,)),
    "rdna4": _profile(
        "rdna4", "RDNA4 (gfx12xx, RX 9000 series)", _FAST, conv3d_first_tier=3, notes=(_NO_3D_SOLVER,)),
    "cdna": _profile("cdna", "CDNA (gfx908/gfx90a/gfx94x/gfx950, Instinct MI100-MI300)", _FAST),
    "unknown": _profile("unknown", "other AMD GPU (architecture not classified)", _FAST,
                        notes=("Unclassified architecture: conservative defaults.",)),
})


@dataclass(frozen=True)
class RocmDefaults:
    """Run-time defaults of the rocm package (timeouts, folders, the bypass threshold)."""

    probe_timeout_s: float = 60.0            # one conv in the hang-probe child
    probe_startup_timeout_s: float = 180.0   # child start: import torch, GPU init (not counted in the above)
    # a probe's first run of a conv: MIOpen JIT-compiles its kernels at first use (minutes on an empty kernel cache,
    # after every PyTorch/ROCm upgrade); only silence this long reads as a hang
    probe_warmup_timeout_s: float = 600.0
    stall_timeout_s: float = 300.0           # VAE decode stall watchdog (stack dump, no kill)
    cache_subdir: str = "rocm"               # <cache root>/rocm (common/environment.py)
    bypass_size_threshold_px: int = 42      # the field notes' 42x42 boundary: larger spatial side of a conv input
    # doctor's attention timing: FramePack's transformer at 608x640, window 9 (memory.plan.framepack_tokens)
    attention_tokens: int = 18485
    attention_heads: int = 24
    attention_head_dim: int = 128
    attention_small_tokens: int = 256                            # --small / CPU: a logic check, not a timing


DEFAULTS = RocmDefaults()

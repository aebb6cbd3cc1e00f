"""Bypass strategies: where the convolution fallback starts for a given call (pure functions).

The names and the settings are the AMD field notes' (``FallbackStrategy``, ``Conv2dBypassConfig``,
``size_threshold``...), with their meanings; what changes is the mechanism. The notes toggle MIOpen variables
in-process, which cannot work (MIOpen reads its variables once per process), so here a strategy only chooses the
first tier of ``rocm.ConvFallback`` and which tiers it may use. No strategy sets or changes any environment
variable.

``size_threshold`` is in pixels, as in the notes: a call is "large" when the larger of its input's two spatial
sides (H, W; frames do not count) exceeds it. The notes' 42 is the 42x42 boundary above which MIOpen's default
algorithm was seen to hang on RDNA1.

"Bypass" means leaving tier 1 (MIOpen / cuDNN): to tier 3 for the notes' GPU "unfold + matmul" (for a conv2d
that is exactly tier 3: im2col + GEMM; a conv3d becomes 2D convs over time; tier 4 is the same without MIOpen), to
tier 5 for the CPU.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from configs.rocm_profiles import CPU, DECOMPOSED, DECOMPOSED_VENDOR_OFF, DEFAULTS
from rocm.signature import ConvSignature


class BypassStrategy(str, enum.Enum):
    """AUTO: tiers in order 1 -> 5, skipping tiers a verdict marked as failing for this shape. With
    ``enable_implicit_gemm=False`` (the notes: "large sizes bypass MIOpen unless implicit GEMM is on") large
    convs start at tier 3.

    IMPLICIT_GEMM: trust MIOpen: conv2d from tier 1. A large conv3d starts at tier 3, the exact decomposition into
    2D convolutions, which MIOpen serves with its 2D solvers (implicit GEMM among them) instead of its 3D path
    (no 3D heuristics; naive solver or 7.3 GB GEMM scratch limit).

    SELECTIVE: only large convs (2D or 3D) bypass MIOpen: they start at tier 3. Smaller ones: AUTO.

    GPU_UNFOLD (alias PURE_PYTORCH): every conv bypasses MIOpen on the GPU: tier 3.

    CPU_FALLBACK: every conv goes to tier 5 (CPU, fp32), results moved back to the GPU: the notes' "maximum
    safety". Slow, but uses no GPU memory for the conv.

    Accepts the names in any case: ``BypassStrategy("CPU_FALLBACK")`` is ``BypassStrategy.CPU_FALLBACK``.
    """

    AUTO = "auto"
    IMPLICIT_GEMM = "implicit_gemm"
    SELECTIVE = "selective"
    GPU_UNFOLD = "gpu_unfold"
    PURE_PYTORCH = "gpu_unfold"          # the notes: an alias of GPU_UNFOLD
    CPU_FALLBACK = "cpu_fallback"

    @classmethod
    def _missing_(cls, value):
        if isinstance(value, str):
            key = value.strip().upper()
            if key in cls.__members__:
                return cls.__members__[key]
        return None


FallbackStrategy = BypassStrategy        # the field notes' name


@dataclass(frozen=True)
class BypassConfig:
    """The notes' ``Conv2dBypassConfig``. ``enable_implicit_gemm``: AUTO tries MIOpen on large convs (False:
    they start at tier 3). ``gpu_unfold_fallback`` / ``cpu_fallback_enabled``: tiers 3-4 (the decompositions) / 5 may be used.
    ``verbose``: SafeConv layers log their first bypass at INFO (else DEBUG). ``cache_decisions``: use the
    remembered verdicts (False: every call starts at the strategy's first tier again)."""

    strategy: BypassStrategy = BypassStrategy.AUTO
    size_threshold: float = DEFAULTS.bypass_size_threshold_px
    enable_implicit_gemm: bool = True
    gpu_unfold_fallback: bool = True
    cpu_fallback_enabled: bool = True
    verbose: bool = True
    cache_decisions: bool = True

    def __post_init__(self):
        object.__setattr__(self, "strategy", BypassStrategy(self.strategy))
        if self.size_threshold < 0:
            raise ValueError("size_threshold must be >= 0 (pixels: the larger spatial side of the conv input)")
        if self.strategy is BypassStrategy.CPU_FALLBACK and not self.cpu_fallback_enabled:
            raise ValueError("strategy CPU_FALLBACK needs cpu_fallback_enabled=True")
        if self.strategy is BypassStrategy.GPU_UNFOLD and not self.gpu_unfold_fallback:
            raise ValueError("strategy GPU_UNFOLD needs gpu_unfold_fallback=True")

    def is_large(self, sig: ConvSignature) -> bool:
        return max(sig.input_shape[-2:]) > self.size_threshold

    def allows(self, tier: int) -> bool:
        return not ((tier in (DECOMPOSED, DECOMPOSED_VENDOR_OFF) and not self.gpu_unfold_fallback)
                    or (tier == CPU and not self.cpu_fallback_enabled))

    def start_tier(self, sig: ConvSignature) -> int:
        """The first tier this strategy allows for ``sig``."""
        s = self.strategy
        if s is BypassStrategy.CPU_FALLBACK:
            return CPU
        if s is BypassStrategy.GPU_UNFOLD:
            return 3
        large = self.is_large(sig)
        if s is BypassStrategy.SELECTIVE and large:
            return 3
        if s is BypassStrategy.IMPLICIT_GEMM and large and sig.base_op == "conv3d":
            return 3
        if s is BypassStrategy.AUTO and large and not self.enable_implicit_gemm:
            return 3
        return 1


def Conv2dBypassConfig(strategy: BypassStrategy | str = BypassStrategy.AUTO,  # noqa: N802 (the notes' name)
                       size_threshold: float = DEFAULTS.bypass_size_threshold_px, enable_implicit_gemm: bool = True,
                       gpu_unfold_fallback: bool = True, cpu_fallback_enabled: bool = True, verbose: bool = True,
                       cache_decisions: bool = True) -> BypassConfig:
    """The field notes' constructor, with their keywords and defaults; returns a ``BypassConfig``."""
    return BypassConfig(BypassStrategy(strategy), size_threshold, enable_implicit_gemm, gpu_unfold_fallback,
                        cpu_fallback_enabled, verbose, cache_decisions)

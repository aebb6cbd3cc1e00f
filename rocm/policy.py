"""Bypass strategies: where the convolution fallback starts for a given call (pure functions).

The field notes toggle MIOpen variables in-process to get these effects; that cannot work (MIOpen reads its
variables once per process), so here each strategy only chooses the first tier of ``rocm.ConvFallback``.
No strategy sets or changes any environment variable.

``size_threshold`` is in MiB of the convolution's *input* tensor (numel x element size): the field notes' 42
means 42 MiB. For scale (fp16, causal padding included): a HunyuanVideo decoder conv at the 256x256 output tile
with 128 channels and 19 frames reads ~309 MiB; a mid-block conv on a 32x32 latent tile (512 ch, 11 frames) ~12 MiB.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from configs.rocm_profiles import DEFAULTS
from rocm.signature import ConvSignature


class BypassStrategy(str, enum.Enum):
    """AUTO: tiers in order 1 -> 4, skipping tiers a verdict marked as failing for this shape.

    IMPLICIT_GEMM: conv3d whose input exceeds the threshold starts at tier 3, the exact decomposition into 2D
    convolutions, which MIOpen serves with its 2D solvers (implicit GEMM among them) instead of its 3D path
    (no 3D heuristics; naive solver or 7.3 GB GEMM scratch limit). Smaller convs and all conv2d: AUTO.

    CPU_FALLBACK: any conv (2D or 3D) whose input exceeds the threshold goes straight to tier 4 (CPU, fp32),
    results moved back to the GPU. Slow, but uses no GPU memory for the conv. Smaller convs: AUTO.

    SELECTIVE: conv3d whose input exceeds the threshold starts at tier 2 (MIOpen off for that call: PyTorch's own
    GPU kernels). Everything else: AUTO.
    """

    AUTO = "auto"
    IMPLICIT_GEMM = "implicit_gemm"
    CPU_FALLBACK = "cpu_fallback"
    SELECTIVE = "selective"


@dataclass(frozen=True)
class BypassConfig:
    strategy: BypassStrategy = BypassStrategy.AUTO
    size_threshold_mib: float = DEFAULTS.bypass_size_threshold_mib

    def __post_init__(self):
        object.__setattr__(self, "strategy", BypassStrategy(self.strategy))
        if self.size_threshold_mib < 0:
            raise ValueError("size_threshold must be >= 0 (MiB of conv input)")

    def start_tier(self, sig: ConvSignature, itemsize: int) -> int:
        """The first tier this strategy allows for ``sig``."""
        big = sig.input_mib(itemsize) > self.size_threshold_mib
        is_3d = sig.base_op == "conv3d"
        if self.strategy is BypassStrategy.IMPLICIT_GEMM and big and is_3d:
            return 3
        if self.strategy is BypassStrategy.CPU_FALLBACK and big:
            return 4
        if self.strategy is BypassStrategy.SELECTIVE and big and is_3d:
            return 2
        return 1

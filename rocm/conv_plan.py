"""Where the convolution fallback starts on a device: a pure function of the device's ``Runtime``.

The plan follows the *hardware* arch (``Runtime.arch``, from the KFD topology), never the one an
``HSA_OVERRIDE_GFX_VERSION`` makes torch report: an RX 5700 XT with the usual 10.3.0 override gets the RDNA1 plan
(no MIOpen), not RDNA2's. The conv fallback and ``doctor`` both read it from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from configs.rocm_profiles import PROFILES
from rocm.arch import Runtime
from rocm.tiers import TIERS


@dataclass(frozen=True)
class ConvPlan:
    tiers: tuple[int, ...]            # allowed tiers, in order
    conv3d_first_tier: int
    vendor_in_decomposition: bool     # whether tier 3's inner conv2d may use MIOpen/cuDNN
    family: str | None                # the ROCm family whose profile it is (None: CUDA/CPU)
    notes: tuple[str, ...] = ()


def conv_plan(runtime: Runtime) -> ConvPlan:
    """The arch profile's plan on ROCm; everything from tier 1 on CUDA and CPU."""
    profile = PROFILES.get(runtime.family or "unknown") if runtime.backend == "rocm" else None
    if profile is None:
        return ConvPlan(TIERS, 1, True, None)
    return ConvPlan(profile.conv_tiers, profile.conv3d_first_tier, profile.vendor_convs_in_decomposition,
                    profile.family, profile.notes)

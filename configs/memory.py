"""Memory limits: the VRAM cap, the preserved-memory default, host-memory options."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryConfig:
    # Hard cap on what PyTorch may allocate on the GPU (enforced with set_per_process_memory_fraction).
    vram_cap_gb: float = 20.0
    # "GPU inference preserved memory": GB of the cap kept free of resident transformer weights for activations,
    # the VAE and other programs. Larger = fewer weights resident = more streaming per step. Same range as FramePack.
    preserved_gb: float = 6.0
    preserved_min_gb: float = 6.0
    preserved_max_gb: float = 128.0
    # Keep host copies of streamed weights in page-locked memory (fast copies); turn off when host RAM is short.
    pin_host_memory: bool = True
    # Streamed transformer blocks copied ahead of the one computing. Measured on an H100: 2 gained nothing over 1.
    prefetch_depth: int = 1


MEMORY = MemoryConfig()

"""Generation defaults (those of the original FramePack app) and the limits every request is checked against."""
from __future__ import annotations

from dataclasses import dataclass

# FramePack's 640 bucket table, (height, width).
BUCKETS_640: tuple[tuple[int, int], ...] = (
    (416, 960), (448, 864), (480, 832), (512, 768), (544, 704), (576, 672), (608, 640),
    (640, 608), (672, 576), (704, 544), (768, 512), (832, 480), (864, 448), (960, 416),
)

MODES = ("original", "f1")
SAMPLERS = ("unipc", "unipc_bh2", "euler")   # pipeline/samplers.py; unipc = FramePack's (bh1)
TEACACHE_CHOICES = (0.0, 0.1, 0.15, 0.2)


@dataclass(frozen=True)
class GenerationDefaults:
    prompt: str = ""
    negative_prompt: str = ""
    seed: int = 31337
    seconds: float = 5.0
    latent_window: int = 9
    steps: int = 25
    cfg: float = 1.0               # real CFG; > 1 runs the negative prompt too (twice the compute)
    gs: float = 10.0               # distilled guidance
    rescale: float = 0.0           # CFG rescale (only with cfg > 1)
    mode: str = "original"         # "original" (inverted anti-drifting) or "f1" (forward)
    sampler: str = "unipc"
    teacache: float = 0.15         # threshold; 0 turns TeaCache off
    resolution: int = 640          # bucket base; the tiny preset uses its own (see presets)
    crf: int = 16
    fps: int = 30


@dataclass(frozen=True)
class Limits:
    seconds: tuple[float, float] = (1.0, 120.0)        # the same everywhere: UI slider, API, CLI, batch
    steps: tuple[int, int] = (1, 100)
    crf: tuple[int, int] = (0, 51)
    gs: tuple[float, float] = (1.0, 32.0)
    cfg: tuple[float, float] = (1.0, 32.0)
    rescale: tuple[float, float] = (0.0, 1.0)
    latent_window: tuple[int, int] = (1, 33)
    teacache: tuple[float, float] = (0.0, 1.0)
    resolution: tuple[int, int] = (64, 1280)
    image_side: tuple[int, int] = (64, 8192)
    image_pixels_max: int = 8192 * 8192                # decompression-bomb guard
    upload_bytes_max: int = 64 * 1024 * 1024
    prompt_chars_max: int = 4000                       # longer prompts are truncated with a warning
    seed: tuple[int, int] = (0, 2**63 - 1)
    fps: tuple[int, int] = (1, 120)


DEFAULTS = GenerationDefaults()
LIMITS = Limits()

"""What a resolution costs on the GPU, before Start: the transformer's activations at that token count and the VAE
decode's tiles, against the VRAM cap.

Measurable formulas (each factor measured on an H100, BENCHMARKS.md), so the plan is arithmetic, tested without a
GPU:

- tokens per transformer step (memory.plan.framepack_tokens): with H×W the bucket and w the latent window,
  (H/16)·(W/16)·(w + 2) for the noisy window and the 1× clean latents (start + newest), plus the 2× and 4×
  compressed history ((H/32)·(W/32) and 4·(H/64)·(W/64)), plus 729 SigLIP and 256 text tokens. 608×640, w = 9:
  18,485 tokens.
- transformer activations = tokens × hidden × dtype bytes × 20 (memory.plan.ACTIVATION_FACTOR: live tensors at
  a block's peak with fused attention, measured 19.4).
- the transformer's least GPU memory = the always-resident part + one resident block + the streaming slots
  (prefetch depth + 1 blocks, the largest, each with its fp8 storage's staging buffer) + the activations: the most
  streaming there is. Preserved memory only moves weights between resident and streamed above that floor. The
  sizes are what the blocks take on the device (memory/estimate.py `transformer_device_sizes`, the residency
  estimate's count): with fp8 compute its Linears in fp8, about 0.6 GB less at full size.
- VAE decode = the VAE's weights + the tile's estimate (memory.vae.memory_estimate: 13.5 × C0 × tile pixels ×
  dtype bytes, measured 13.2, plus the decoded frames kept for blending) for the largest decode of a job: 2w + 1
  latent frames. The tiles are chosen as memory.vae.VaeDecodePolicy chooses them, with the room it keeps free for
  cuDNN's workspace on NVIDIA (`workspace_reserve`); the least is its smallest tile.

A size fits when both floors are under the cap. `largest_fitting` walks sizes down (a bucket target 16 at a time,
or a custom size keeping its aspect ratio) to the first that fits: the nearest size the plan accepts.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace
from typing import Callable, Iterable

import torch

from common.units import GIB
from configs.memory import MEMORY
from memory.estimate import transformer_config, transformer_device_sizes, transformer_hidden
from memory.plan import activation_bytes, framepack_tokens
from memory.vae import VaeDecodePolicy, VaeTiling, memory_estimate
from memory.vae_grid import GridTiling

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
VAE_MARGIN = 512 << 20          # what memory.manager.decode_vae keeps back of the free memory


def _items(cfg) -> tuple:
    return tuple(sorted((k, tuple(v) if isinstance(v, (list, tuple)) else v) for k, v in cfg.items()))


@dataclass(frozen=True)
class ModelFigures:
    """The sizes the cost needs, from a preset and the job's weight settings (counted on the meta device: no
    memory, no download)."""
    block_bytes: tuple[int, ...]        # on the device (fp8 compute: its Linears in fp8)
    other_bytes: int
    stage_bytes: int                    # fp8 storage: the stored bytes staged beside each streaming slot
    hidden: int
    act_dtype_bytes: int
    vae_bytes: int
    vae_channels: int
    vae_dtype_bytes: int


@lru_cache(maxsize=4)
def _vae_params(items: tuple) -> int:
    from diffusers import AutoencoderKLHunyuanVideo

    with torch.device("meta"):
        vae = AutoencoderKLHunyuanVideo(**dict(items))
    return sum(p.numel() for p in vae.parameters())


def model_figures(preset, weight_storage: str = "native", fp8_compute: bool = False) -> ModelFigures:
    """The transformer's blocks and the VAE of a preset (the real HunyuanVideo configs, or the tiny ones), the
    blocks as a job with `weight_storage` and `fp8_compute` (--fp8-compute) lays them on the device."""
    titems, tr_bytes = transformer_config(preset)
    chunks, stage = transformer_device_sizes(preset, weight_storage, fp8_compute)
    vae_bytes = DTYPE_BYTES[preset.vae.dtype]
    vitems = _items(preset.tiny_configs["vae"]) if preset.tiny else ()
    channels = dict(vitems).get("block_out_channels", (128, 256, 512, 512))[0]
    return ModelFigures(chunks[1:], chunks[0], stage, transformer_hidden(titems), tr_bytes,
                        _vae_params(vitems) * vae_bytes, channels, vae_bytes)


@dataclass(frozen=True)
class ResolutionCost:
    height: int
    width: int
    window: int
    cap_bytes: int
    tokens: int
    activation_bytes: int
    transformer_floor: int        # other + one block + slots + activations
    vae_weights: int
    vae_tiling: VaeTiling | GridTiling      # the tiles the decode would start with under the cap
    vae_tile_bytes: int           # its estimate
    vae_floor: int                # weights + the smallest tile's estimate

    @property
    def fits(self) -> bool:
        return self.transformer_floor <= self.cap_bytes and self.vae_floor <= self.cap_bytes

    def short_of(self) -> str:
        """Which stage does not fit and by how much (empty when it fits)."""
        out = []
        cap = self.cap_bytes / GIB
        if self.transformer_floor > self.cap_bytes:
            out.append(f"the transformer needs at least {self.transformer_floor / GIB:.1f} GB with every block but one "
                       f"streamed (activations {self.activation_bytes / GIB:.1f} GB for {self.tokens:,} tokens)")
        if self.vae_floor > self.cap_bytes:
            out.append(f"the VAE decode needs at least {self.vae_floor / GIB:.1f} GB at its smallest tiles")
        return "; ".join(out) + (f", more than the {cap:g} GB VRAM cap" if out else "")

    def describe(self) -> str:
        """One line for the page and the log."""
        head = (f"{self.width}×{self.height}: {self.tokens:,} tokens per step → activations ≈ "
                f"{self.activation_bytes / GIB:.1f} GB (transformer at least {self.transformer_floor / GIB:.1f} GB); "
                f"VAE decode {self.vae_tiling.describe()} ≈ {(self.vae_weights + self.vae_tile_bytes) / GIB:.1f} GB")
        if self.fits:
            return head + f"; fits under the {self.cap_bytes / GIB:g} GB cap"
        return head + f"; does not fit: {self.short_of()}"


def resolution_cost(figures: ModelFigures, height: int, width: int, window: int, cap_gb: float,
                    prefetch_depth: int = MEMORY.prefetch_depth, workspace_reserve: int = 0,
                    stream: dict | None = None) -> ResolutionCost:
    """The weight settings (fp8 storage, fp8 compute) are the figures' (`model_figures`). `workspace_reserve`:
    what the decode keeps free beside its tiles on the job's device (memory.vae.cudnn_workspace_reserve), `stream`:
    its streamed-decoder settings (memory.vae.streamed_decode), so the tiles shown are the ones the job starts
    with."""
    cap = int(cap_gb * GIB)
    tokens = framepack_tokens(height, width, window)
    act = activation_bytes(tokens, figures.hidden, figures.act_dtype_bytes)
    biggest = max(figures.block_bytes)
    streamed = len(figures.block_bytes) - 1
    slots = min(prefetch_depth + 1, streamed) * (biggest + figures.stage_bytes)
    floor = figures.other_bytes + figures.block_bytes[0] + slots + act
    shape = (2 * window + 1, height // 8, width // 8)

    def mem(t: VaeTiling | GridTiling) -> int:
        return memory_estimate(t, shape, figures.vae_channels, figures.vae_dtype_bytes)

    vae = SimpleNamespace(config=SimpleNamespace(block_out_channels=(figures.vae_channels,)), dtype=None)
    policy = VaeDecodePolicy(workspace_reserve=workspace_reserve, **(stream or {"streamed": False}))
    available = max(0, cap - figures.vae_bytes - VAE_MARGIN)
    tiling = _first_tiling(policy, vae, shape, available, figures.vae_dtype_bytes)
    smallest = min(mem(t) for t in policy.pool(shape))
    return ResolutionCost(height, width, window, cap, tokens, act, floor, figures.vae_bytes, tiling, mem(tiling),
                          figures.vae_bytes + smallest + VAE_MARGIN)


def _first_tiling(policy: VaeDecodePolicy, vae, shape, available: int,
                  dtype_bytes: int) -> VaeTiling | GridTiling:
    """The tiling VaeDecodePolicy.plan starts with (its dtype read from the figures, not from a model)."""

    vae.dtype = {4: torch.float32, 2: torch.float16}[dtype_bytes]
    return policy.plan(vae, shape, available)[0]


def largest_fitting(sizes: Iterable, cost: Callable[..., ResolutionCost]):
    """The first of `sizes` (largest first) whose cost fits, with its cost; None when none fits."""
    for size in sizes:
        c = cost(size)
        if c.fits:
            return size, c
    return None

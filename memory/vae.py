"""VAE decode inside the cap: tile sizes chosen from the budget, smaller tiles on out-of-memory, then rocm's conv
fallback.

On a GPU the decode runs the streamed decoder (memory/vae_stream.py: the same decoder a few frames at a time, about
a quarter of the memory) on a grid of flush tiles (memory/vae_grid.py), so a 608×640 section needs 1–2 tiles under
a 20 GB cap; `streamed_decode(device)` says so from configs/video.py. Everything below about diffusers' tiles is the
CPU's path and the path with `streamed` off.

diffusers' HunyuanVideo VAE decodes in overlapping tiles (spatial `tile_sample_min_height/width` with a 3/4 stride,
temporal `tile_sample_min_num_frames`). Overlap is recomputed work: 256-pixel tiles on a 608×640 frame decode 2.7×
the pixels of one full-frame tile, and 16-frame temporal tiles decode 5 latent frames per 3. So the policy takes
the least total work whose memory estimate fits the free part of the cap, and on out-of-memory retries with the
least work among clearly smaller tiles; when no smaller tile is left, the smallest runs once more with the rocm
conv fallback active (tiered convolution down to the CPU). On ROCm the tile also keeps MIOpen's GEMM scratch under
the size where MIOpen drops to its naive solver (docs/FACTS.md).
"""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

import rocm
from common.units import GIB
from configs.video import DECODE_SPEED
from memory.vae_grid import GridTiling, grid_candidates, grid_decode
from memory.vae_stream import CHUNK_BYTES
from rocm.conv_plan import conv_plan

log = logging.getLogger(__name__)

SPATIAL_TILES = (0, 512, 384, 320, 256, 192, 128, 96, 64, 32)     # pixels; 0 = the whole frame
# Tiles far smaller than the frame cost more in overlap than they save (at 32 px a 608×640 decode became hundreds
# of tiles and ran for minutes on an H100): nothing under 128 px, or under half the frame for small frames. Below
# that, the conv fallback is the remedy.
MIN_TILE = 128
TEMPORAL_TILES = (0, 32, 16, 8)                                   # pixel frames; 0 = all frames at once
# Live full-resolution activations at the decoder's peak, in units of C0 × pixels × dtype bytes. Measured on the
# H100 with the full-size VAE (fp16): 13.2 (256px/16-frame tiles), 13.2 (whole frames/16), 12.9 (384px/all).
ACT_FACTOR = 13.5
MIOPEN_SCRATCH_LIMIT = int(7.29e9)


def miopen_scratch_limit(runtime) -> int | None:
    """MIOpen's 3D GEMM scratch limit where the VAE's conv3d reaches MIOpen 3D (the device's conv plan starts conv3d
    at tier 1: CDNA, unknown families); None elsewhere. RDNA starts conv3d at tier 3 (exact 2D decomposition) and
    RDNA1 keeps MIOpen off, so the limit only shrank their streamed decoder's chunks (1–2 frames per call at
    608×640) for a scratch they never allocate."""
    if runtime.backend != "rocm":
        return None
    return MIOPEN_SCRATCH_LIMIT if conv_plan(runtime).conv3d_first_tier <= 1 else None
# The streamed decoder (memory/vae_stream.py) holds a layer's input and output whole, the rest in chunks. Its peak,
# measured on the H100 (fp16, channels-last, 2026-11-26: the first, middle and last sections of the job in
# 1–2 tiles, chunks of 0.5–1.5 GiB, and a small tile with 256 MiB chunks) is covered by 3.3 × C0 × tile pixels ×
# dtype bytes + 1.5 chunks (a chunk's padded input, its output, cuDNN's copies) + the causal history kept between
# chunks (2 frames of the widest layer) + 256 MiB (cuDNN's workspace, the mid-block's attention): 2–12 % above each.
STREAM_FACTOR = 3.3
STREAM_CHUNKS = 1.5
STREAM_FIXED = 256 << 20


@dataclass(frozen=True)
class VaeTiling:
    size: int         # spatial tile in pixels (0: none)
    frames: int       # temporal tile in pixel frames (0: none)

    @property
    def stride(self) -> int:
        return self.size * 3 // 4 // 8 * 8

    @property
    def frame_stride(self) -> int:
        return max(4, self.frames * 3 // 4 // 4 * 4)

    def describe(self) -> str:
        s = f"{self.size}px tiles" if self.size else "whole frames"
        return s + (f", {self.frames}-frame temporal tiles" if self.frames else ", all frames at once")

    def spans(self, lat_frames: int, lat_h: int, lat_w: int) -> tuple[list[int], list[int], list[int]]:
        """Latent extents of the tiles diffusers' loops make (temporal, rows, columns)."""
        def cut(n, tile, stride, extra=0):
            return [min(tile + extra, n - i) for i in range(0, n, stride)]

        t_tile = self.frames // 4
        t = cut(lat_frames, t_tile, self.frame_stride // 4, 1) if self.frames and lat_frames > t_tile \
            else [lat_frames]
        lt = self.size // 8
        if self.size and (lat_h > lt or lat_w > lt):
            return t, cut(lat_h, lt, self.stride // 8), cut(lat_w, lt, self.stride // 8)
        return t, [lat_h], [lat_w]

    def apply(self, vae) -> None:
        vae.use_tiling = bool(self.size)
        if self.size:
            vae.tile_sample_min_height = vae.tile_sample_min_width = self.size
            vae.tile_sample_stride_height = vae.tile_sample_stride_width = self.stride
        vae.use_framewise_decoding = bool(self.frames)
        if self.frames:
            vae.tile_sample_min_num_frames = self.frames
            vae.tile_sample_stride_num_frames = self.frame_stride


_VAE_ATTRS = ("use_tiling", "use_framewise_decoding", "tile_sample_min_height", "tile_sample_min_width",
              "tile_sample_stride_height", "tile_sample_stride_width", "tile_sample_min_num_frames",
              "tile_sample_stride_num_frames")


def work(tiling: VaeTiling | GridTiling, shape: tuple[int, int, int]) -> int:
    """Latent voxels decoded, overlap included (proportional to the decode's compute)."""
    t, rows, cols = tiling.spans(*shape)
    return sum(t) * sum(rows) * sum(cols)


def memory_estimate(tiling: VaeTiling | GridTiling, shape: tuple[int, int, int], channels: int = 128,
                    dtype_bytes: int = 2, factor: float = ACT_FACTOR) -> int:
    """Peak bytes of one tile's decode, plus the decoded output kept for blending."""
    if isinstance(tiling, GridTiling):
        return stream_memory_estimate(tiling, shape, channels, dtype_bytes)
    t, rows, cols = tiling.spans(*shape)
    f, h, w = max(t), max(rows), max(cols)
    pixels = ((f - 1) * 4 + 1) * h * 8 * w * 8
    # The mid-block builds a dense causal mask over the tile's latent tokens: bool + fp32 + final dtype per pair,
    # transient and at latent resolution, so it competes with (does not add to) the full-resolution peak.
    mask = 7 * (f * h * w) ** 2
    frames, lh, lw = shape
    output = 2 * 3 * ((frames - 1) * 4 + 1) * lh * 8 * lw * 8 * dtype_bytes
    return max(int(factor * channels * pixels * dtype_bytes), mask) + output


def stream_memory_estimate(tiling: GridTiling, shape: tuple[int, int, int], channels: int = 128,
                           dtype_bytes: int = 2) -> int:
    """Peak bytes of the streamed decoder on one tile, plus the blended output (float32 and the final copy)."""
    frames, lh, lw = shape
    _, rows, cols = tiling.spans(*shape)
    pixel_frames = (frames - 1) * 4 + 1
    tile = pixel_frames * max(rows) * 8 * max(cols) * 8
    whole = pixel_frames * lh * 8 * lw * 8
    output = 3 * whole * (dtype_bytes + (4 if len(rows) * len(cols) > 1 else 0))
    halo = 2 * 2 * channels * max(rows) * 8 * max(cols) * 8 * dtype_bytes
    return int(STREAM_FACTOR * channels * tile * dtype_bytes + STREAM_CHUNKS * tiling.chunk_bytes) + halo + \
        STREAM_FIXED + output


def scratch_estimate(tiling: VaeTiling | GridTiling, shape: tuple[int, int, int], channels: int = 256,
                     dtype_bytes: int = 2) -> int:
    """MIOpen's im2col scratch for the widest 3×3×3 convolution at full resolution (the streamed decoder: of one
    output frame, the least it runs a convolution on)."""
    t, rows, cols = tiling.spans(*shape)
    frames = 1 if isinstance(tiling, GridTiling) else (max(t) - 1) * 4 + 1
    pixels = frames * max(rows) * 8 * max(cols) * 8
    return channels * 27 * pixels * dtype_bytes


def candidates(shape: tuple[int, int, int]) -> list[VaeTiling]:
    _, lh, lw = shape
    smallest = min(MIN_TILE, max(lh, lw) * 8 // 2)
    sizes = [s for s in SPATIAL_TILES if s == 0 or smallest <= s < max(lh, lw) * 8]
    frames = [f for f in TEMPORAL_TILES if f == 0 or f // 4 < shape[0]]
    return [VaeTiling(s, f) for s in sizes for f in frames]


def cudnn_workspace_reserve(device) -> int:
    """Bytes kept free beside the VAE tiles for cuDNN's convolution workspace on `device` (configs/video.py
    `cudnn_workspace_gb`): NVIDIA only; 0 on ROCm (MIOpen's scratch has its own limit) and on the CPU. The memory
    manager gives it to the decode policy and the plan before Start (memory/resolution.py) shows the same tiles."""

    if torch.device(device).type != "cuda" or torch.version.hip is not None:
        return 0
    return int(DECODE_SPEED.cudnn_workspace_gb * GIB)


def streamed_decode(device) -> dict:
    """VaeDecodePolicy's streamed-decoder fields for the decode on `device` (configs/video.py): the streamed
    decoder on GPUs, channels-last on NVIDIA only. The memory manager and the plan before Start (memory/resolution.py)
    both take them from here."""

    streamed = DECODE_SPEED.streamed and torch.device(device).type == "cuda"
    return {"streamed": streamed, "chunk_bytes": DECODE_SPEED.stream_chunk_mb << 20,
            "channels_last": streamed and DECODE_SPEED.stream_channels_last and torch.version.hip is None}


def is_oom(exc: BaseException) -> bool:
    return rocm.classify_error(exc) == "oom"


@dataclass
class VaeDecodePolicy:
    """Chooses tiles, retries smaller on OOM, hands the last try to the rocm conv fallback."""
    act_factor: float = ACT_FACTOR
    scratch_limit: int | None = None                       # MIOpen's GEMM scratch limit (set on ROCm)
    fault: Callable[[VaeTiling | GridTiling], None] | None = None   # test seam: may raise OOM for a tiling
    # Test seams: the scope of the last try and of the tries before it. Default: the decode's conv fallback
    # (`decode(conv=...)`): `active()` for the last try; `passing_oom()` before it, so that an out-of-memory inside a
    # convolution reaches this policy (smaller tiles) instead of moving the conv fallback to a slower tier.
    fallback: Callable[[], contextlib.AbstractContextManager] | None = None
    first_tries: Callable[[], contextlib.AbstractContextManager] | None = None
    attempts: list[dict] = field(default_factory=list)     # of the last decode, for the record
    # Room left free beside the tiles for cuDNN's convolution workspace (NVIDIA; the memory manager sets it from
    # configs/video.py). With benchmark off, cuDNN's first heuristic engine runs only if its workspace can be
    # allocated at that moment, else a slower one with other rounding: without this room the decode was 1.8× slower
    # and its frames depended on what else was free (benchmarks/vae_repeat.py). At most a quarter of `available`;
    # dropped when no tiling fits with it.
    workspace_reserve: int = 0
    # The streamed decoder and its grid of tiles (memory/vae_stream.py, vae_grid.py) instead of diffusers' decoder
    # and tiles; None: the memory manager sets them from the device (streamed_decode).
    streamed: bool | None = None
    channels_last: bool = False
    chunk_bytes: int = CHUNK_BYTES
    # Called after an out-of-memory, before the next (smaller) try: the memory manager releases parked transformer
    # blocks there (memory/parking.py), so a retry has all of the cap the stage itself does not hold.
    before_retry: Callable[[], object] | None = None

    def pool(self, shape: tuple[int, int, int]) -> list[VaeTiling | GridTiling]:
        """The tilings this policy chooses from."""
        return [*grid_candidates(shape, self.chunk_bytes)] if self.streamed else [*candidates(shape)]

    def _mem(self, vae, shape: tuple[int, int, int]) -> Callable[[VaeTiling | GridTiling], int]:
        size = torch.finfo(vae.dtype).bits // 8
        return lambda t: memory_estimate(t, shape, vae.config.block_out_channels[0], size, self.act_factor)

    def room(self, vae, shape: tuple[int, int, int], available: int) -> int:
        """Bytes of `available` the decode's first tiling needs: its estimated peak and its workspace room (all of
        `available` when none fits with that room). What else may stay on the device (memory/parking.py)."""
        mem = self._mem(vae, shape)(self.plan(vae, shape, available)[0])
        need = mem + min(self.workspace_reserve, available // 4)
        return need if need <= available else available

    def plan(self, vae, shape: tuple[int, int, int], available: int | None) -> list[VaeTiling | GridTiling]:
        """Tilings to try, in order: least work that fits first, each next one clearly smaller in memory."""
        channels = vae.config.block_out_channels[0]
        up = vae.config.block_out_channels[1] if len(vae.config.block_out_channels) > 1 else channels
        size = torch.finfo(vae.dtype).bits // 8
        mem = self._mem(vae, shape)
        pool = self.pool(shape)
        if self.scratch_limit is not None:
            ok = [t for t in pool if scratch_estimate(t, shape, up, size) <= self.scratch_limit]
            pool = ok or [min(pool, key=lambda t: scratch_estimate(t, shape, up, size))]
        pool.sort(key=lambda t: (work(t, shape), mem(t)))
        reserve = min(self.workspace_reserve, available // 4) if available is not None else 0
        fits = [t for t in pool if available is None or mem(t) + reserve <= available] \
            or [t for t in pool if available is not None and mem(t) <= available]
        order = [fits[0] if fits else min(pool, key=mem)]
        while True:
            smaller = [t for t in pool if mem(t) < 0.7 * mem(order[-1])]
            if not smaller:
                return order
            order.append(smaller[0])

    def decode(self, vae, z: torch.Tensor, available: int | None, conv=None) -> torch.Tensor:
        """Decode with the tilings of `plan()`. `conv`: the job's rocm.ConvFallback (passed explicitly by the memory
        manager, never looked up); None: no conv fallback around the tries."""
        shape = tuple(z.shape[2:])
        order = self.plan(vae, shape, available)
        saved = {a: getattr(vae, a) for a in _VAE_ATTRS if hasattr(vae, a)}
        self.attempts = []
        try:
            for i, tiling in enumerate(order):
                last = i == len(order) - 1
                try:
                    return self._attempt(vae, z, tiling, shape, available, conv, fallback=False)
                except Exception as e:
                    if not is_oom(e):
                        raise
                    self._failed(tiling, e)
                    if last:
                        log.warning("VAE decode: out of memory at the smallest tiles (%s); handing over to the "
                                    "rocm conv fallback", tiling.describe())
                        return self._attempt(vae, z, tiling, shape, available, conv, fallback=True)
        finally:
            for a, v in saved.items():
                setattr(vae, a, v)

    def _scope(self, conv, fallback: bool) -> contextlib.AbstractContextManager:
        seam = self.fallback if fallback else self.first_tries
        if seam is not None:
            return seam()
        if conv is None:
            return contextlib.nullcontext()
        return conv.active() if fallback else conv.passing_oom()

    def _attempt(self, vae, z, tiling: VaeTiling | GridTiling, shape, available, conv, fallback: bool) -> torch.Tensor:
        est = self._mem(vae, shape)(tiling)
        self.attempts.append({"tiling": tiling.describe(), "estimate": est, "available": available,
                              "work": work(tiling, shape), "fallback": fallback, "ok": False})
        log.info("VAE decode of %s latents: %s (estimate %.2f GB of %s free)%s", shape, tiling.describe(),
                 est / GIB, f"{available / GIB:.2f} GB" if available is not None else "unlimited",
                 " with the rocm conv fallback" if fallback else "")
        if isinstance(tiling, VaeTiling):
            tiling.apply(vae)
        with self._scope(conv, fallback):
            if self.fault is not None:
                self.fault(tiling)
            if isinstance(tiling, GridTiling):
                pixels = grid_decode(vae, z, tiling, self.channels_last, self.scratch_limit)
            else:
                pixels = vae.decode(z).sample
        self.attempts[-1]["ok"] = True
        return pixels

    def _failed(self, tiling: VaeTiling | GridTiling, exc: BaseException) -> None:
        log.warning("VAE decode: out of memory with %s: %s", tiling.describe(), str(exc).splitlines()[0][:200])
        if self.before_retry is not None:
            self.before_retry()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.empty_cache()

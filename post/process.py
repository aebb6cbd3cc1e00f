"""The model steps on frames (RGB uint8 arrays), a chunk at a time: RIFE interpolation, GFPGAN face restoration and
ESRGAN-family upscaling, batched, fp16 on GPUs (bf16 for the face model, whose StyleGAN2 decoder overflows fp16;
fp32 on the CPU), tiled where a frame does not fit."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch
import torch.nn.functional as F

from post.rife import ALIGN

BATCH = 8                   # frames per model call
TILE_OVERLAP = 32           # input pixels each tile sees beyond its own part (cut off after)
UPSCALE_BYTES_PER_PIXEL = 3 * 1024      # an RRDBNet's live activations per input pixel in fp16 (measured bound)


def dtype_for(device: torch.device, kind: str = "") -> torch.dtype:
    """The dtype a post model runs in on a device (`kind`: "face" for the GFPGAN model)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if kind == "face" else torch.float16


def _to_tensor(frames: list[np.ndarray], device, dtype) -> torch.Tensor:
    x = torch.from_numpy(np.stack(frames)).to(device)
    return x.permute(0, 3, 1, 2).to(dtype).div_(255.0)


def _to_frames(x: torch.Tensor) -> list[np.ndarray]:
    y = x.float().clamp_(0, 1).mul_(255.0).round_().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    return list(y)


@torch.inference_mode()
def interpolate(net, frames: list[np.ndarray], times: list[Fraction], offset: int, device, dtype) -> list[np.ndarray]:
    """The output frames at `times` (positions in the edited sequence). `frames[i]` is edited frame offset + i. A
    whole position is that frame itself (the same array: bit for bit), any other is RIFE's frame between its two
    neighbours."""
    out: list[np.ndarray | None] = [None] * len(times)
    todo = []
    for n, p in enumerate(times):
        j = math.floor(p)
        if p == j:
            out[n] = frames[j - offset]
        else:
            todo.append((n, j - offset, float(p - j)))
    if todo:
        h, w = frames[0].shape[:2]
        ph, pw = -(-h // ALIGN) * ALIGN, -(-w // ALIGN) * ALIGN
        for b in range(0, len(todo), BATCH):
            part = todo[b:b + BATCH]
            a = _to_tensor([frames[j] for _, j, _ in part], device, dtype)
            c = _to_tensor([frames[j + 1] for _, j, _ in part], device, dtype)
            a, c = F.pad(a, (0, pw - w, 0, ph - h)), F.pad(c, (0, pw - w, 0, ph - h))
            t = torch.tensor([t for _, _, t in part], device=device, dtype=dtype).view(-1, 1, 1, 1)
            mid = net(a, c, t)[:, :, :h, :w]
            for (n, _, _), frame in zip(part, _to_frames(mid)):
                out[n] = frame
    return out  # type: ignore[return-value]


def tile_side(height: int, width: int, free_bytes: int | None, batch: int = 1) -> int | None:
    """The input tile side that fits `free_bytes` of activations (None: the whole frame fits, or no limit known)."""
    if free_bytes is None:
        return None
    pixels = free_bytes // UPSCALE_BYTES_PER_PIXEL
    if height * width * batch <= pixels:
        return None
    return max(64, int(math.isqrt(max(pixels, 1))) - 2 * TILE_OVERLAP)


def _upscale_tiled(model, x: torch.Tensor, scale: int, tile: int) -> torch.Tensor:
    n, c, h, w = x.shape
    out = torch.empty(n, c, h * scale, w * scale, device=x.device, dtype=x.dtype)
    for top in range(0, h, tile):
        for left in range(0, w, tile):
            bottom, right = min(top + tile, h), min(left + tile, w)
            t0, l0 = max(top - TILE_OVERLAP, 0), max(left - TILE_OVERLAP, 0)
            t1, l1 = min(bottom + TILE_OVERLAP, h), min(right + TILE_OVERLAP, w)
            y = model(_even(x[:, :, t0:t1, l0:l1], model))
            out[:, :, top * scale:bottom * scale, left * scale:right * scale] = \
                y[:, :, (top - t0) * scale:(bottom - t0) * scale, (left - l0) * scale:(right - l0) * scale]
    return out


def _even(x: torch.Tensor, model) -> torch.Tensor:
    """Pad to what the model's pixel-unshuffle needs (x2: even sides; x1: multiples of 4)."""
    m = getattr(model, "unshuffle", 1)
    h, w = x.shape[-2:]
    if h % m or w % m:
        x = F.pad(x, (0, (-w) % m, 0, (-h) % m), mode="replicate")
    return x


@torch.inference_mode()
def upscale(model, scale: int, frames: list[np.ndarray], device, dtype, free_bytes: int | None = None,
            tile: int | None = None) -> list[np.ndarray]:
    """Every frame `scale` times larger. `tile` (input pixels) forces tiles; else they are used when a batch does
    not fit `free_bytes`."""
    h, w = frames[0].shape[:2]
    out: list[np.ndarray] = []
    batch = BATCH if tile is None and tile_side(h, w, free_bytes, BATCH) is None else 1
    tile = tile or tile_side(h, w, free_bytes, 1)
    for b in range(0, len(frames), batch):
        x = _to_tensor(frames[b:b + batch], device, dtype)
        y = _upscale_tiled(model, x, scale, tile) if tile else model(_even(x, model))
        out += _to_frames(y[:, :, :h * scale, :w * scale])
    return out


def face_box(height: int, width: int) -> tuple[int, int, int]:
    """(top, left, side) of the square the face model sees: the frame's centred square (post/faces.py: aligned
    mode, no detector)."""
    side = min(height, width)
    return (height - side) // 2, (width - side) // 2, side


def _feather(side: int, device, dtype) -> torch.Tensor:
    """1 inside the square, falling linearly to 0 over its outer sixteenth: the restored square's edge does not
    show against the frame around it."""
    ramp = max(1, side // 16)
    pos = torch.arange(side, device=device, dtype=torch.float32)
    edge = torch.minimum(pos + 1, side - pos).div(ramp).clamp(max=1.0)
    return (edge.view(-1, 1) * edge.view(1, -1)).to(dtype)


@torch.inference_mode()
def restore_faces(model, frames: list[np.ndarray], strength: float, device, dtype) -> list[np.ndarray]:
    """Every frame with its centred square restored by the face model at the model's size (resized there and
    back, antialiased), blended in by `strength` under a feathered edge; the frame size is kept. The model runs in
    `dtype`; the resizing and blending in fp32 (antialiased resizing has no bf16 kernel on the CPU)."""
    h, w = frames[0].shape[:2]
    top, left, side = face_box(h, w)
    size = model.spec.size
    mask = _feather(side, device, torch.float32).mul_(float(strength))
    out: list[np.ndarray] = []
    for b in range(0, len(frames), BATCH):
        x = _to_tensor(frames[b:b + BATCH], device, torch.float32)
        crop = x[:, :, top:top + side, left:left + side]
        face = F.interpolate(crop, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        restored = model(face.mul(2.0).sub_(1.0).to(dtype)).float().clamp_(-1.0, 1.0).add_(1.0).div_(2.0)
        back = F.interpolate(restored, size=(side, side), mode="bilinear", align_corners=False, antialias=True)
        x[:, :, top:top + side, left:left + side] = crop + mask * (back - crop)
        out += _to_frames(x)
    return out

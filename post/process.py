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
    if device.type != "cuda" or kind == "detector":        # the detector is small: fp32 everywhere
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


FACE_TEMPLATE = np.array([[192.98138, 239.94708], [318.90277, 240.1936], [256.63416, 314.01935],
                          [201.26117, 371.41043], [313.08905, 371.15118]])     # GFPGAN's 5 points in a 512×512 face


def similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """The 2×3 similarity transform (rotation, uniform scale, shift) that maps the points `src` onto `dst` best in
    least squares (Umeyama's closed form; a reflection is never chosen)."""
    src, dst = np.asarray(src, np.float64), np.asarray(dst, np.float64)
    ms, md = src.mean(0), dst.mean(0)
    s, d = src - ms, dst - md
    u, sig, vt = np.linalg.svd(d.T @ s / len(src))
    flip = np.diag([1.0, np.sign(np.linalg.det(u) * np.linalg.det(vt)) or 1.0])
    rot = u @ flip @ vt
    scale = float((sig * np.diag(flip)).sum() / max((s ** 2).sum() / len(src), 1e-12))
    return np.hstack((scale * rot, (md - scale * rot @ ms)[:, None]))


def _invert(m: np.ndarray) -> np.ndarray:
    a = np.linalg.inv(m[:, :2])
    return np.hstack((a, (-a @ m[:, 2])[:, None]))


def _sample(image: torch.Tensor, m: np.ndarray, height: int, width: int, top: int = 0, left: int = 0,
            padding: str = "border") -> torch.Tensor:
    """`image` (N×C×h×w) sampled at `m` @ (x, y, 1) for the pixels (x, y) of a height×width window whose corner is
    (left, top): bilinear, pixel centres at whole coordinates (as OpenCV's warpAffine)."""
    h, w = image.shape[-2:]
    ys, xs = torch.meshgrid(torch.arange(top, top + height, device=image.device, dtype=torch.float32),
                            torch.arange(left, left + width, device=image.device, dtype=torch.float32), indexing="ij")
    mt = torch.tensor(m, device=image.device, dtype=torch.float32)
    sx = mt[0, 0] * xs + mt[0, 1] * ys + mt[0, 2]
    sy = mt[1, 0] * xs + mt[1, 1] * ys + mt[1, 2]
    grid = torch.stack((sx * (2.0 / max(w - 1, 1)) - 1.0, sy * (2.0 / max(h - 1, 1)) - 1.0), -1)
    return F.grid_sample(image, grid[None].expand(image.shape[0], -1, -1, -1).to(image.dtype), mode="bilinear",
                         padding_mode=padding, align_corners=True)


def _feather(side: int, device, dtype) -> torch.Tensor:
    """1 inside the square, falling linearly to 0 over its outer sixteenth: the restored face's edge does not
    show against the frame around it."""
    ramp = max(1, side // 16)
    pos = torch.arange(side, device=device, dtype=torch.float32)
    edge = torch.minimum(pos + 1, side - pos).div(ramp).clamp(max=1.0)
    return (edge.view(-1, 1) * edge.view(1, -1)).to(dtype)


@torch.inference_mode()
def restore_faces(model, frames: list[np.ndarray], strength: float, device, dtype, find) -> list[np.ndarray]:
    """Every frame with each face `find(frame)` gives (its five landmarks, pixels: eyes, nose, mouth corners)
    aligned to GFPGAN's template at the model's size, restored, and pasted back through the inverse transform under
    a feathered mask, blended in by `strength`; frames without a face are returned as they are (the same array).
    The model runs in `dtype`, the warps and the blending in fp32."""
    size = model.spec.size
    template = FACE_TEMPLATE * (size / 512.0)
    mask = _feather(size, device, torch.float32)[None, None]
    todo = [(n, similarity(points, template)) for n, frame in enumerate(frames) for points in find(frame)]
    out = list(frames)
    if not todo:
        return out
    restored: list[torch.Tensor] = []
    for b in range(0, len(todo), BATCH):
        part = todo[b:b + BATCH]
        crops = torch.cat([_sample(_to_tensor([frames[n]], device, torch.float32), _invert(m), size, size)
                           for n, m in part])
        faces = model(crops.mul(2.0).sub_(1.0).to(dtype)).float().clamp_(-1.0, 1.0).add_(1.0).div_(2.0)
        restored += list(faces[:, None])
    tensors: dict[int, torch.Tensor] = {}
    for (n, m), face in zip(todo, restored):
        x = tensors.setdefault(n, _to_tensor([frames[n]], device, torch.float32))
        h, w = x.shape[-2:]
        corners = _invert(m) @ np.array([[0, 0, 1], [size - 1, 0, 1], [0, size - 1, 1], [size - 1, size - 1, 1]]).T
        x0, y0 = (max(0, int(np.floor(v))) for v in corners.min(1))
        x1, y1 = min(w, int(np.ceil(corners[0].max())) + 1), min(h, int(np.ceil(corners[1].max())) + 1)
        if x1 <= x0 or y1 <= y0:
            continue
        back = _sample(face, m, y1 - y0, x1 - x0, y0, x0)
        weight = _sample(mask, m, y1 - y0, x1 - x0, y0, x0, padding="zeros").mul_(float(strength))
        window = x[:, :, y0:y1, x0:x1]
        x[:, :, y0:y1, x0:x1] = window + weight * (back - window)
    for n, x in tensors.items():
        out[n] = _to_frames(x)[0]
    return out

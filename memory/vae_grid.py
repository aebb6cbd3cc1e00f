"""Tiles for the streamed decoder (memory/vae_stream.py): a grid of rows × columns that covers the frame with a
fixed overlap and no tile past its edge, blended with weights that sum to one.

diffusers' tiling (square tiles at a 3/4 stride, each kept up to its stride) decodes slivers past the frame's edge:
on a 608×640 frame its 256 px tiles decode 96 × 104 latents for 76 × 80 (1.64× the work). Here a frame is cut
into n tiles of equal size s = ⌈(L + (n − 1)·overlap) / n⌉, the last one flush with the edge, so the work is
(L + (n − 1)·overlap) per axis: 2 rows of a 76-latent frame decode 84 (1.11×). With the streamed decoder's smaller
memory a middle section of the issue's job fits in 2 such rows under the 20 GB cap.

Blending: along each axis a tile's weight ramps linearly over its overlap with each neighbour and the weights of
all tiles are normalised to sum to one at every pixel; a pixel's weight is the product of its row and column
weights. So a region covered by one tile is that tile's pixels exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from memory.vae_stream import CHUNK_BYTES, StreamedDecoder

OVERLAP = 8            # latents (64 pixels) shared by neighbouring tiles: diffusers' blend at its 256 px tiles
MIN_TILE = 16          # latents (128 pixels): smaller tiles cost more in overlap than they save
MIN_CHUNK = 32 << 20   # bytes: the least chunk a grid's tiles get


def cuts(length: int, n: int, overlap: int = OVERLAP) -> list[tuple[int, int]]:
    """(start, size) of n tiles covering [0, length): equal sizes, neighbours sharing ≥ overlap, the last flush."""
    if n <= 1:
        return [(0, length)]
    size = -(-(length + (n - 1) * overlap) // n)
    starts = [i * (size - overlap) for i in range(n - 1)] + [length - size]
    return [(s, size) for s in starts]


def axis_weights(length: int, spans: list[tuple[int, int]], scale: int) -> list[torch.Tensor]:
    """Per tile, float32 weights over its pixels (span × scale) along one axis; they sum to one at every pixel."""
    raw = []
    for i, (start, size) in enumerate(spans):
        p = torch.arange(size * scale, dtype=torch.float64) + 0.5
        w = torch.ones_like(p)
        if i > 0:
            lead = (spans[i - 1][0] + spans[i - 1][1] - start) * scale
            w = torch.minimum(w, p / lead)
        if i < len(spans) - 1:
            trail = (start + size - spans[i + 1][0]) * scale
            w = torch.minimum(w, (size * scale - p) / trail)
        raw.append(w)
    total = torch.zeros(length * scale, dtype=torch.float64)
    for (start, size), w in zip(spans, raw):
        total[start * scale:(start + size) * scale] += w
    return [(w / total[start * scale:(start + size) * scale]).float() for (start, size), w in zip(spans, raw)]


@dataclass(frozen=True)
class GridTiling:
    rows: int
    cols: int
    overlap: int = OVERLAP
    chunk_bytes: int = CHUNK_BYTES       # the streamed decoder's chunk (memory/vae_stream.py): part of the peak

    def describe(self) -> str:
        if self.rows == self.cols == 1:
            return "whole frames, streamed"
        return f"{self.rows}×{self.cols} tiles, streamed"

    def spans(self, lat_frames: int, lat_h: int, lat_w: int) -> tuple[list[int], list[int], list[int]]:
        """Latent extents of the tiles (temporal, rows, columns), as VaeTiling.spans gives them."""
        return ([lat_frames], [s for _, s in cuts(lat_h, self.rows, self.overlap)],
                [s for _, s in cuts(lat_w, self.cols, self.overlap)])


def grid_candidates(shape: tuple[int, int, int], chunk_bytes: int, overlap: int = OVERLAP) -> list[GridTiling]:
    """Every grid whose tiles are at least MIN_TILE (or the whole axis) and wider than twice the overlap. A grid
    of small tiles gets a smaller chunk (in proportion to its tile, at most `chunk_bytes`), so that on
    out-of-memory the policy's smaller tiles really need less."""
    _, lh, lw = shape

    def counts(length: int) -> list[int]:
        out = [1]
        for n in range(2, length):
            size = cuts(length, n, overlap)[0][1]
            if size < max(MIN_TILE, 2 * overlap + 1):
                break
            out.append(n)
        return out

    def chunk(rows: int, cols: int) -> int:
        share = cuts(lh, rows, overlap)[0][1] * cuts(lw, cols, overlap)[0][1] / (lh * lw)
        return max(MIN_CHUNK, min(chunk_bytes, int(2 * share * chunk_bytes)))
    return [GridTiling(r, c, overlap, chunk(r, c)) for r in counts(lh) for c in counts(lw)]


@torch.no_grad()
def grid_decode(vae, z: torch.Tensor, tiling: GridTiling, channels_last: bool = False,
                scratch_limit: int | None = None) -> torch.Tensor:
    """Pixels of latents z (n, c, frames, h, w) decoded tile by tile with the streamed decoder and blended."""
    decode = StreamedDecoder(tiling.chunk_bytes, channels_last, scratch_limit)

    scale = getattr(vae, "spatial_compression_ratio", 8)
    n, _, frames, lh, lw = z.shape
    rows, cols = cuts(lh, tiling.rows, tiling.overlap), cuts(lw, tiling.cols, tiling.overlap)
    if len(rows) == len(cols) == 1:
        return decode(vae.decoder, vae.post_quant_conv(z))
    row_w, col_w = axis_weights(lh, rows, scale), axis_weights(lw, cols, scale)
    out = None
    for (r0, rs), rw in zip(rows, row_w):
        for (c0, cs), cw in zip(cols, col_w):
            tile = decode(vae.decoder, vae.post_quant_conv(z[:, :, :, r0:r0 + rs, c0:c0 + cs]))
            if out is None:
                out = torch.zeros((n, tile.shape[1], tile.shape[2], lh * scale, lw * scale), dtype=torch.float32,
                                  device=tile.device)
            weight = (rw.to(tile.device)[:, None] * cw.to(tile.device)[None, :])
            region = out[..., r0 * scale:(r0 + rs) * scale, c0 * scale:(c0 + cs) * scale]
            region.addcmul_(tile, weight)
            del tile
    assert out is not None                              # (a grid has a tile)
    return out.to(vae.dtype)

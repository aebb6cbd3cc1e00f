"""The video so far, kept as uint8 chunks plus the float frames the next cross-fade will touch.

Holding the whole video as float32 would need ~17 GB for 120 s at 640 px; here only `overlap` frames stay float
(the edge the next section blends into: the head in the original mode, the tail in F1) and the rest is uint8,
which gives the same frames as blending everything in float and quantizing at the end.
"""
from __future__ import annotations

import numpy as np
import torch

from pipeline.sections import soft_append
from pipeline.video import pixels_to_frames


class VideoBuffer:
    def __init__(self, mode: str, overlap: int):
        self.mode = mode
        self.overlap = overlap
        self._chunks: list[np.ndarray] = []     # settled uint8 frames, in video order, edge excluded
        self._edge: torch.Tensor | None = None  # (1, 3, overlap, H, W) float, the blendable edge

    def __len__(self) -> int:
        edge = 0 if self._edge is None else self._edge.shape[2]
        return sum(c.shape[0] for c in self._chunks) + edge

    def add(self, decoded: torch.Tensor) -> None:
        """Blend a newly decoded part (1, 3, T, H, W) in [-1, 1] into the video."""
        part = decoded.detach().float().cpu()
        ov = self.overlap
        if self._edge is not None:
            if self.mode == "original":
                part = soft_append(part, self._edge, ov)          # the new part goes before the video
            else:
                part = soft_append(self._edge, part, ov)
        if self.mode == "original":
            keep, settle = part[:, :, :ov], part[:, :, ov:]
            if settle.shape[2]:
                self._chunks.insert(0, pixels_to_frames(settle))
        else:
            settle, keep = part[:, :, :-ov], part[:, :, -ov:]
            if settle.shape[2]:
                self._chunks.append(pixels_to_frames(settle))
        self._edge = keep

    def frames(self) -> np.ndarray:
        """(T, H, W, 3) uint8, the whole video."""
        if self._edge is None:
            raise ValueError("the video is empty")
        edge = pixels_to_frames(self._edge)
        parts = [edge, *self._chunks] if self.mode == "original" else [*self._chunks, edge]
        return np.concatenate(parts, axis=0)

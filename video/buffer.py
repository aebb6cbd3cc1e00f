"""The video so far, kept as uint8 chunks plus the float frames the next cross-fade will touch.

Holding the whole video as float32 would need ~17 GB for 120 s at 640 px; here only `overlap` frames stay float
(the edge the next section blends into: the head in the original mode, the tail in F1) and the rest is uint8,
which gives the same frames as blending everything in float and quantizing at the end. A settled chunk never
changes again, so each has a key (its settling order) and the video writer encodes it once.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch

from video.blend import soft_append
from video.mp4 import pixels_to_frames

Part = tuple[int | None, np.ndarray]     # (key of a settled chunk, or None for the edge; (T, H, W, 3) uint8)


class VideoBuffer:
    def __init__(self, mode: str, overlap: int):
        self.mode = mode
        self.overlap = overlap
        self._chunks: list[tuple[int, np.ndarray]] = []   # settled (key, uint8 frames), in video order, no edge
        self._edge: torch.Tensor | None = None  # (1, 3, overlap, H, W) float, the blendable edge
        self._settled = 0

    def __len__(self) -> int:
        edge = 0 if self._edge is None else self._edge.shape[2]
        return sum(c.shape[0] for _, c in self._chunks) + edge

    def add(self, decoded: torch.Tensor | np.ndarray) -> None:
        """Blend a newly decoded part (1, 3, T, H, W) in [-1, 1] into the video; or add finished frames, (T, H, W, 3)
        uint8 (an extended video's input): they start an empty video (`start_with`), or go before an original-mode
        video (`lead_with`)."""
        if isinstance(decoded, np.ndarray):
            if self.mode == "original" and len(self):
                self.lead_with(decoded)
            else:
                self.start_with(decoded)
            return
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
                self._chunks.insert(0, (self._settled, pixels_to_frames(settle)))
                self._settled += 1
        else:
            settle, keep = part[:, :, :-ov], part[:, :, -ov:]
            if settle.shape[2]:
                self._chunks.append((self._settled, pixels_to_frames(settle)))
                self._settled += 1
        self._edge = keep

    def start_with(self, frames: np.ndarray) -> None:
        """Begin an empty video with (T, H, W, 3) uint8 frames: all but the `overlap` frames the next part
        cross-fades into settle as they are (bit for bit); those become the edge (uint8 -> float -> uint8 is exact).
        F1: the new parts go after them (the edge is their end); original: before them (the edge is their start)."""
        if len(self):
            raise ValueError("only an empty video can start with finished frames")
        self._check(frames)
        ov = self.overlap
        settle, edge = (frames[ov:], frames[:ov]) if self.mode == "original" else (frames[:-ov], frames[-ov:])
        if settle.shape[0]:
            self._chunks.append((self._settled, np.ascontiguousarray(settle)))
            self._settled += 1
        self._edge = _to_pixels(edge)

    def lead_with(self, frames: np.ndarray) -> None:
        """Put (T, H, W, 3) uint8 frames before an original-mode video whose first frame repeats their last one
        (an extension toward an end frame: its start latent is the input video's last frame): that frame is left
        out and the frames join without a cross-fade, bit for bit."""
        if self.mode != "original" or not len(self):
            raise ValueError("only a started original-mode video can be led by finished frames")
        self._check(frames)
        ov = self.overlap
        rest = pixels_to_frames(self._edge)[1:]
        if rest.shape[0]:
            self._chunks.insert(0, (self._settled, rest))
            self._settled += 1
        if frames.shape[0] > ov:
            self._chunks.insert(0, (self._settled, np.ascontiguousarray(frames[ov:])))
            self._settled += 1
        self._edge = _to_pixels(frames[:ov])

    def _check(self, frames: np.ndarray) -> None:
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[0] < self.overlap:
            raise ValueError(f"need at least {self.overlap} uint8 T×H×W×3 frames, not {frames.shape} {frames.dtype}")

    def parts(self) -> list[Part]:
        """The whole video as consecutive parts, in video order: the edge (key None) and the settled chunks."""
        if self._edge is None:
            raise ValueError("the video is empty")
        edge = (None, pixels_to_frames(self._edge))
        return [edge, *self._chunks] if self.mode == "original" else [*self._chunks, edge]

    def frames(self) -> np.ndarray:
        """(T, H, W, 3) uint8, the whole video."""
        return np.concatenate([frames for _, frames in self.parts()], axis=0)


def _to_pixels(frames: np.ndarray) -> torch.Tensor:
    """(T, H, W, 3) uint8 -> (1, 3, T, H, W) float32 in [-1, 1]."""
    return torch.from_numpy(np.ascontiguousarray(frames)).float().div(127.5).sub(1.0).permute(3, 0, 1, 2).unsqueeze(0)


def frames_sha256(parts: list[Part]) -> str:
    """sha256 of the whole video's uint8 frames (T, H, W, 3), in order, without joining the parts."""
    digest = hashlib.sha256()
    for _, frames in parts:
        digest.update(np.ascontiguousarray(frames).data)
    return digest.hexdigest()

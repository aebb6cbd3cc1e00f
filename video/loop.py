"""The loop switch's seam (configs/controls.py "loop"): the video's last frames cross-faded toward its first frame,
so that it plays on repeat without a jump. The original mode also ends its sampling at the start image (the start
latent as the end frame: pipeline/orchestrator.py); this blend smooths what is left. Pure: numpy in, numpy out."""
from __future__ import annotations

import numpy as np

SEAM_FRAMES = 8            # frames blended at the end (about a quarter second at 30 fps)


def seam_blend(frames: np.ndarray, seam: int = SEAM_FRAMES) -> np.ndarray:
    """(T, H, W, 3) uint8 frames with the last `seam` blended toward frame 0: the k-th of them (k = 1 … seam) gets
    the share k / (seam + 1) of the first frame, so the last frame is nearly the first and the next one on repeat
    is the first itself. A video of fewer than seam + 1 frames blends all but its first. The input is not
    changed."""
    if frames.ndim != 4 or frames.dtype != np.uint8:
        raise ValueError(f"need T×H×W×3 uint8 frames, not {frames.shape} {frames.dtype}")
    n = min(int(seam), frames.shape[0] - 1)
    out = frames.copy()
    if n <= 0:
        return out
    first: np.ndarray = frames[0].astype(np.float32)
    share = (np.arange(1, n + 1, dtype=np.float32) / (n + 1))[:, None, None, None]
    tail: np.ndarray = frames[-n:].astype(np.float32)
    out[-n:] = np.clip(np.rint((1 - share) * tail + share * first), 0, 255).astype(np.uint8)
    return out

"""Helpers for the video file tests (tests/test_video.py and the child processes it starts)."""
from __future__ import annotations

import numpy as np


def smooth_moving_frames(n: int, h: int = 96, w: int = 128, seed: int = 0) -> np.ndarray:
    """Smooth content in motion, with a little noise (something an encoder has decisions to make about)."""
    rng = np.random.RandomState(seed)
    y, x = np.mgrid[0:h, 0:w]
    out = [np.stack([np.sin((x + 3 * t) / 9.0), np.cos((y - 2 * t) / 11.0), np.sin((x + y + t) / 15.0)], -1)
           * 0.4 + 0.5 + 0.04 * rng.rand(h, w, 3) for t in range(n)]
    return (np.clip(np.stack(out), 0, 1) * 255).astype(np.uint8)

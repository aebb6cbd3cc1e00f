"""Helpers for the post-processing tests (tests/test_post*.py): a short test video to process, and what a video
file holds (frames, size, rate)."""
from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from video.mp4 import write_mp4


def pattern_video(path: Path, frames: int = 12, size=(48, 64), fps: int = 30) -> Path:
    """A moving noise pattern of `frames` frames, `size` (height, width), as the mp4 `path` with a job's
    metadata (a prompt and a seed)."""
    rng = np.random.default_rng(1)
    base = rng.integers(0, 255, (size[0], size[1], 3)).astype(np.uint8)
    clip = np.stack([np.roll(base, 2 * k, axis=1) for k in range(frames)])     # a moving picture
    return write_mp4(clip, path, fps=fps, metadata={"comment": "prompt: a moving test pattern | seed: 7",
                                                   "title": "a moving test pattern"})


def video_shape(path: Path) -> tuple[int, int, int, Fraction]:
    """(frames, width, height, average frame rate) of the video file `path`, its frames counted by decoding."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        n = sum(1 for _ in c.decode(s))
        return n, s.codec_context.width, s.codec_context.height, s.average_rate

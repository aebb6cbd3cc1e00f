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


def conv_flops(model, *args) -> int:
    """2 × the multiply-adds of every convolution a forward pass of `model` runs (nn.Conv2d, the transposed ones
    and the functional modulated ones alike: each aten.convolution, counted at its input's size when transposed),
    to check the benchmarks' arithmetic floor (the models' `flop_per_*`) against what the network really computes.
    torch's own FlopCounterMode is not used: its module tracker fails on the face model's forward."""
    import math

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Convolutions(TorchDispatchMode):
        flops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.convolution.default:
                x, w, transposed = args[0], args[1], args[6]
                spatial = x.shape[2:] if transposed else out.shape[2:]
                self.flops += 2 * x.shape[0] * w.shape[0] * w.shape[1] * math.prod(w.shape[2:]) * math.prod(spatial)
            return out

    with torch.no_grad(), Convolutions() as counted:
        model(*args)
    return counted.flops

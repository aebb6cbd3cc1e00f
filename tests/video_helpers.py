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


def audio_only(path):
    """A short AAC file with no video stream (a source every door must refuse naming the file); returns `path`."""
    import av

    with av.open(str(path), "w") as c:
        stream = c.add_stream("aac", rate=16000)
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
        frame.sample_rate = 16000
        for packet in [*stream.encode(frame), *stream.encode()]:
            c.mux(packet)
    return path

"""MP4 writing with PyAV: H.264, yuv420p (plays in browsers), CRF, prompt and seed in the metadata; atomic."""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import torch

from configs.generation import LIMITS

log = logging.getLogger(__name__)


def pixels_to_frames(video: torch.Tensor) -> np.ndarray:
    """(1, 3, T, H, W) in [-1, 1] -> (T, H, W, 3) uint8."""
    v = ((video[0].float().clamp(-1, 1) + 1.0) * 127.5 + 0.5).to(torch.uint8)
    return v.permute(1, 2, 3, 0).contiguous().cpu().numpy()


def write_mp4(frames: np.ndarray, path: Path, *, fps: int = 30, crf: int = 16, metadata: dict | None = None) -> Path:
    """Write (T, H, W, 3) uint8 frames. The file appears under its name only when complete."""
    import av

    lo, hi = LIMITS.crf
    if not (lo <= int(crf) <= hi):
        raise ValueError(f"crf: {crf} is outside {lo}–{hi}")
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8:
        raise ValueError(f"frames must be T×H×W×3 uint8, not {frames.shape} {frames.dtype}")
    t, h, w, _ = frames.shape
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        with av.open(str(tmp), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
            for key, value in (metadata or {}).items():
                container.metadata[key] = value if isinstance(value, str) else json.dumps(value)
            stream = container.add_stream("libx264", rate=fps)
            stream.width, stream.height = w - w % 2, h - h % 2
            stream.pix_fmt = "yuv420p"
            # One encoder thread: the same frames always give the same file (a resumed job's video equals an
            # uninterrupted one's); multi-threaded runs were seen to differ now and then.
            stream.options = {"crf": str(int(crf)), "preset": "medium", "threads": "1"}
            for frame in frames:
                vf = av.VideoFrame.from_ndarray(frame[: stream.height, : stream.width], format="rgb24")
                vf = vf.reformat(format="yuv420p")   # explicit: the encoder's implicit conversion varies run to run
                for packet in stream.encode(vf):
                    container.mux(packet)
            for packet in stream.encode():
                container.mux(packet)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def read_frames(path: Path) -> np.ndarray:
    """Decode an mp4 back to (T, H, W, 3) uint8 (tests, resume)."""
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def read_metadata(path: Path) -> dict:
    import av

    with av.open(str(path)) as container:
        return dict(container.metadata)

"""MP4 writing with PyAV: H.264, yuv420p (plays in browsers), CRF, prompt and seed in the metadata; atomic.

A file is a sequence of segments, each an independent closed H.264 stream (starting with an IDR frame) encoded by
`encode_segment`, joined without re-encoding by `write_segments`. x264 runs with `stitchable` (stream headers
that do not depend on the content) so every segment has the same SPS/PPS and the joined stream is one valid
stream. A segment's bytes depend only on its frames and configs.video.ENCODING, on any CPU and in any run:
- `cpu-independent`: x264's AVX-512 macroblock-tree routine reads memory it never wrote (configs/video.py), which
  made the bytes change from run to run on AVX-512 CPUs; x264 runs that step in its C code instead;
- frame threads, never slices: PyAV opens libx264 with slice threading and, unless told otherwise, x264 picks its
  thread count from the CPUs the calling thread may run on (sched_getaffinity), one slice per thread; that count
  is written into the stream, so the bytes used to follow the CPU set of the process (tests/test_video.py shows
  it). Frame threads code the same frames as one thread as long as motion fits their vertical search range;
  the count is still part of the bytes (x264's options SEI) and bounds that range, so it is a fixed setting;
- the pixel conversion to yuv420p is explicit (swscale, bit-exact), not left to the encoder.
"""
from __future__ import annotations

import io
import json
import logging
from fractions import Fraction
from pathlib import Path

import numpy as np
import torch

from common.files import atomic_path
from configs.generation import LIMITS
from configs.video import ENCODING, VideoEncoding

log = logging.getLogger(__name__)


def pixels_to_frames(video: torch.Tensor) -> np.ndarray:
    """(1, 3, T, H, W) in [-1, 1] -> (T, H, W, 3) uint8: ((clamp(x) + 1) · 127.5 + 0.5) truncated, each step in
    float32. The steps run in place on one float32 copy and the conversion writes the frames' layout directly
    (the last section's file waits for this: a whole-size temporary per step cost page faults each time)."""
    v = video[0].to(device="cpu", dtype=torch.float32, copy=True)
    v.clamp_(-1, 1).add_(1.0).mul_(127.5).add_(0.5)
    out = torch.empty(v.shape[1:] + v.shape[:1], dtype=torch.uint8)
    out.permute(3, 0, 1, 2).copy_(v)
    return out.numpy()


def _check(frames: np.ndarray, crf: int) -> None:
    lo, hi = LIMITS.crf
    if not (lo <= int(crf) <= hi):
        raise ValueError(f"crf: {crf} is outside {lo}–{hi}")
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise ValueError(f"frames must be T×H×W×3 uint8 (T ≥ 1), not {frames.shape} {frames.dtype}")


def encode_segment(frames: np.ndarray, *, fps: int = 30, crf: int = 16,
                   encoding: VideoEncoding = ENCODING) -> bytes:
    """(T, H, W, 3) uint8 frames as a closed H.264 segment (an in-memory mp4 holding one stream)."""
    import av

    _check(frames, crf)
    _, h, w, _ = frames.shape
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.width, stream.height = w - w % 2, h - h % 2
        stream.pix_fmt = "yuv420p"
        stream.codec_context.thread_type = "FRAME"
        stream.options = {"crf": str(int(crf)), "preset": encoding.preset, "threads": str(encoding.x264_threads),
                          "x264-params": encoding.x264_params}
        for frame in frames:
            vf = av.VideoFrame.from_ndarray(frame[: stream.height, : stream.width], format="rgb24")
            for packet in stream.encode(vf.reformat(format="yuv420p")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def write_segments(segments: list[bytes], path: Path, *, fps: int = 30, metadata: dict | None = None) -> Path:
    """Join encoded segments, in order, into one mp4 at `path`. The file appears under its name only when
    complete."""
    import av

    if not segments:
        raise ValueError("no segments to write")
    path = Path(path)
    with atomic_path(path) as tmp, \
            av.open(str(tmp), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        for key, value in (metadata or {}).items():
            container.metadata[key] = value if isinstance(value, str) else json.dumps(value)
        out, header, start = None, None, Fraction(0)          # start: seconds before the segment
        for segment in segments:
            with av.open(io.BytesIO(segment)) as source:
                stream = source.streams.video[0]
                if out is None:
                    out, header = container.add_stream_from_template(stream), stream.codec_context.extradata
                elif stream.codec_context.extradata != header:
                    raise ValueError("segments were encoded with different stream headers; encode them again")
                offset = start / stream.time_base
                if offset.denominator != 1:
                    raise ValueError(f"a segment boundary at {start} s is not on the time base "
                                     f"{stream.time_base}")
                count = 0
                for packet in source.demux(stream):
                    if packet.size == 0:
                        continue
                    count += 1
                    packet.pts += int(offset)
                    packet.dts += int(offset)
                    packet.stream = out
                    container.mux(packet)
            start += Fraction(count, fps)
    return path


def write_mp4(frames: np.ndarray, path: Path, *, fps: int = 30, crf: int = 16, metadata: dict | None = None,
              encoding: VideoEncoding = ENCODING) -> Path:
    """Write (T, H, W, 3) uint8 frames as one segment."""
    return write_segments([encode_segment(frames, fps=fps, crf=crf, encoding=encoding)], path, fps=fps,
                          metadata=metadata)


def read_frames(path: Path) -> np.ndarray:
    """Decode an mp4 back to (T, H, W, 3) uint8 (tests, resume)."""
    import av

    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def decoded_frames(path: Path) -> int:
    """How many frames the file decodes to (a job's record is checked against it: jobfolder/folder.py). Raises
    OSError (av.FFmpegError is one) when it cannot be opened or decoded."""
    import av

    with av.open(str(path)) as container:
        return sum(1 for _ in container.decode(video=0))


def read_metadata(path: Path) -> dict:
    import av

    with av.open(str(path)) as container:
        return dict(container.metadata)

"""The source videos of a post job, read with PyAV a run of frames at a time (seeking to the keyframe before it), so
a job holds one chunk's frames however long the video is. Frames are RGB uint8 (H, W, 3); a joined source of another
size is scaled to the first's by FFmpeg's scaler (`VideoFrame.reformat`)."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from common.errors import InputError

log = logging.getLogger(__name__)

RUN_GAP = 24            # needed frames closer than this are decoded in one pass (no second seek)
SIDE_MAX = 8192


@dataclass(frozen=True)
class SourceInfo:
    path: Path
    frames: int
    fps: Fraction
    width: int
    height: int


def probe(path: Path) -> SourceInfo:
    """The video's frame count, rate and size (InputError naming "video" for a file that is not a readable video)."""
    import av

    path = Path(path)
    if not path.is_file():
        raise InputError("video", "there is no file {file}", path=path)
    try:
        with av.open(str(path)) as container:
            if not container.streams.video:
                raise InputError("video", "{file} has no video stream", path=path)
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.guessed_rate or Fraction(30)
            width, height = stream.codec_context.width, stream.codec_context.height
            count = stream.frames or sum(1 for _ in container.decode(stream))
    except InputError:
        raise
    except (av.error.FFmpegError, OSError, ValueError) as e:
        log.info("video %s unreadable: %s", path, e)
        raise InputError("video", "{file} could not be read as a video", path=path,
                         advice="Give an mp4, webm or mov video.") from None
    if not count or not width or not height or max(width, height) > SIDE_MAX:
        raise InputError("video", "{file} has no frames of a usable size", path=path)
    return SourceInfo(path, int(count), Fraction(rate).limit_denominator(1001), int(width), int(height))


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for i in sorted(set(indices)):
        if out and i - out[-1][1] <= RUN_GAP:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return out


def _decode_run(info: SourceInfo, first: int, last: int, keep: set[int], size: tuple[int, int]) -> dict[int, np.ndarray]:
    """Frames first..last of a file (those in `keep`), by decoding from the keyframe at or before `first`."""
    import av

    got: dict[int, np.ndarray] = {}
    with av.open(str(info.path)) as container:
        stream = container.streams.video[0]
        base = stream.start_time or 0
        if first > 0:
            container.seek(base + int(Fraction(first) / info.fps / stream.time_base), stream=stream, backward=True)
        index = None
        for frame in container.decode(stream):
            if frame.pts is not None:
                index = int(round((frame.pts - base) * stream.time_base * info.fps))
            else:
                index = 0 if index is None else index + 1
            if index > last:
                break
            if index in keep:
                if (frame.width, frame.height) != size:
                    frame = frame.reformat(width=size[0], height=size[1])
                got[index] = frame.to_ndarray(format="rgb24")
    if first > 0 and any(i not in got for i in keep if first <= i <= last):
        log.debug("seek in %s missed frames %d..%d: decoding from the start", info.path, first, last)
        return _decode_run(info, 0, last, keep, size)
    return got


def read(infos: list[SourceInfo], wanted: list[tuple[int, int]]) -> dict[tuple[int, int], np.ndarray]:
    """The frames `wanted` ((source, frame) pairs) by pair, at the first source's size."""
    size = (infos[0].width, infos[0].height)
    out: dict[tuple[int, int], np.ndarray] = {}
    for s, info in enumerate(infos):
        mine = [k for src, k in wanted if src == s]
        for first, last in _runs(mine):
            keep = {k for k in mine if first <= k <= last}
            frames = _decode_run(info, first, last, keep, size)
            missing = keep - set(frames)
            if missing:
                raise InputError("video", f"{{file}} has fewer frames than it says (frame {min(missing)} is "
                                          f"missing)", path=info.path)
            out.update({(s, k): f for k, f in frames.items()})
    return out

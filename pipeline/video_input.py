"""An input video (mp4, webm, mov ...) for extending: checked, decoded with PyAV, turned upright, converted to the
job's frame rate and resized/cropped to the bucket like a start image (pipeline/images.py).

Every problem a user can cause raises InputError naming the field ("video") and the file, before any model loads:
unreadable or empty files, a file without a video stream (audio only), a side above 8192 px, a video longer than
the length limit (configs: the longest `seconds`), a rotation that is not a multiple of 90°.

Handled rather than refused:
- rotation metadata (the display matrix, as phones write it): the frames are turned as a player would show them
  (`frame.rotation` is the counterclockwise angle, ffmpeg's `av_display_rotation_get`);
- variable frame rate: frames are resampled by their timestamps, so VFR and any constant rate become `fps`
  frames per second the same way: output frame k shows the source frame on screen at time k / fps (the last one
  whose timestamp is ≤ that time, give or take a quarter frame for rounded timestamps). A constant 30 fps input
  keeps every frame, unchanged.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from common.errors import InputError
from common.files import file_sha256
from configs.generation import LIMITS
from pipeline.buckets import nearest_bucket
from pipeline.images import resize_center_crop

log = logging.getLogger(__name__)

FIELD = "video"
VIDEO_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".m4v", ".avi")
VIDEO_BYTES_MAX = 4 << 30            # a 120 s clip is far smaller; a larger file is not one we can hold decoded
READABLE = "Give an mp4, webm or mov video (H.264, VP9, AV1 ...)."



@dataclass(frozen=True)
class InputVideo:
    """A decoded input video: (T, H, W, 3) uint8 frames at `fps`, bucketed; where it came from."""
    path: Path
    sha256: str
    frames: np.ndarray
    fps: int
    source_size: tuple[int, int]      # (width, height) as shown (after rotation)
    source_fps: float                 # frames / duration of the file
    rotation: int                     # degrees the frames were turned (counterclockwise)
    variable_rate: bool

    @property
    def height(self) -> int:
        return self.frames.shape[1]

    @property
    def width(self) -> int:
        return self.frames.shape[2]


def _refused(path: Path, template: str, advice: str = "") -> InputError:
    return InputError(FIELD, template, path=path, advice=advice)


def _rotation(degrees: float, path: Path) -> int:
    quarter = round(degrees / 90.0)
    if abs(degrees - 90.0 * quarter) > 0.5:
        raise _refused(path, f"{{file}} is rotated by {degrees:g}° (rotation metadata); only multiples of 90° can "
                             f"be turned upright", "Rotate the video with a video editor first.")
    return (quarter * 90) % 360


def _open_stream(path: Path):
    """(container, its video stream); raises InputError for files that cannot be a video."""
    import av

    if not path.exists():
        raise _refused(path, "file not found: {file}", "Upload or choose an existing video file.")
    if path.is_dir():
        raise _refused(path, "{file} is a folder but not a job folder (no job.json)",
                       "Give a video file or a finished job's folder under outputs/.")
    size = path.stat().st_size
    if size == 0:
        raise _refused(path, "{file} is empty (0 bytes)", READABLE)
    if size > VIDEO_BYTES_MAX:
        raise _refused(path, f"{{file}} is {size >> 20} MB; the limit is {VIDEO_BYTES_MAX >> 20} MB")
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError, ValueError, UnicodeDecodeError):
        raise _refused(path, "{file} is not a readable video (damaged, or not a video format FFmpeg knows)",
                       READABLE) from None
    if not container.streams.video:
        kind = "audio only" if container.streams.audio else "no video stream"
        container.close()
        raise _refused(path, f"{{file}} has no video stream ({kind})", READABLE)
    stream = container.streams.video[0]
    w, h = stream.codec_context.width, stream.codec_context.height
    if max(w, h) > LIMITS.image_side[1]:
        container.close()
        raise _refused(path, f"{{file}} is {w}×{h} pixels; each side may have at most {LIMITS.image_side[1]}")
    longest = LIMITS.seconds[1]
    seconds = container.duration / 1e6 if container.duration is not None else 0.0
    if seconds > longest + 0.5:
        container.close()
        raise _refused(path, f"{{file}} is {seconds:.1f} s long; the limit is {longest:g} s",
                       "Cut the part to continue from (its end) with a video editor.")
    return container, stream


def load_video(source, resolution: int, fps: int = 30, min_frames: int = 1) -> InputVideo:
    """Decode and check the video at `source` (a path) for a job at `fps` and bucket base `resolution`. Raises
    InputError naming the field and the file."""
    import av

    if source is None:
        raise InputError(FIELD, "no video given")
    path = Path(source)
    container, stream = _open_stream(path)
    longest = LIMITS.seconds[1]
    shown, rotation, bucket = [], None, None
    times: list[float] = []
    try:
        with container:
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if frame.time is None:
                    continue
                if rotation is None:
                    rotation = _rotation(float(frame.rotation or 0), path)
                t = float(frame.time)
                if t > longest + 1.0:
                    raise _refused(path, f"{{file}} is longer than the limit of {longest:g} s",
                                   "Cut the part to continue from (its end) with a video editor.")
                if times and t <= times[-1]:
                    continue                                    # a repeated timestamp: the later frame is dropped
                image = frame.to_image()
                if rotation:
                    image = image.rotate(rotation, expand=True)   # PIL turns counterclockwise, like the matrix
                if bucket is None:
                    bucket = nearest_bucket(image.height, image.width, resolution)
                    size = image.size
                shown.append(np.asarray(resize_center_crop(image, *bucket)))
                times.append(t)
    except InputError:
        raise
    except (av.FFmpegError, OSError, ValueError) as e:
        raise _refused(path, f"{{file}} could not be decoded ({type(e).__name__}: {str(e)[:80]})", READABLE) \
            from None
    if not shown:
        raise _refused(path, "{file} has no frames (an empty video)", READABLE)
    frames, variable = resample(times, fps)
    out = np.stack([shown[i] for i in frames])
    if len(out) < min_frames:
        raise _refused(path, f"{{file}} has {len(out)} frames at {fps} fps; extending needs at least {min_frames}",
                       "Use a longer clip (or a smaller latent window).")
    duration = times[-1] - times[0] + (times[-1] - times[-2] if len(times) > 1 else 1.0 / fps)
    if variable:
        log.info("%s: variable frame rate; resampled to %d fps by timestamps", path.name, fps)
    return InputVideo(path, file_sha256(path), out, fps, size, len(times) / duration, rotation or 0, variable)


def resample(times: list[float], fps: int) -> tuple[list[int], bool]:
    """(for each output frame k at time k/fps from the first frame, the index of the source frame on screen then;
    whether the source's frame intervals vary). The output lasts as long as the source (its last frame shown for
    the median interval)."""
    t0 = times[0]
    rel = np.asarray(times, dtype=np.float64) - t0
    if len(rel) == 1:
        return [0], False
    steps = np.diff(rel)
    median = float(np.median(steps))
    variable = bool(np.any(np.abs(steps - median) > max(0.002, 0.05 * median)))
    duration = rel[-1] + median
    slack = 0.25 / fps                  # container time bases round timestamps (webm: to the millisecond)
    count = max(1, int(np.floor(duration * fps + 0.25)))
    wanted = np.arange(count) / fps
    index = np.searchsorted(rel, wanted + slack, side="right") - 1
    return [int(i) for i in np.clip(index, 0, len(rel) - 1)], variable

"""The section videos, written on a background thread while the next section samples.

The orchestrator hands each decoded part to `SectionWriter.submit` and goes on; the writer thread blends it into
the video (video/buffer.py), hashes the raw frames and writes the section's mp4. Each file is the whole
video so far (the UI's growing video), made of segments (video/mp4.py): every settled chunk is encoded once,
on a small pool of threads, and reused by every later file; only the edge the next section will blend into is
encoded again. So the work per section stays the same however long the video gets, and the job waits at its end
only for the last file. Results come back in order through `poll()` (non-blocking) and `finish()` (waits); an
error in the writer is raised there, in the job's thread, after the files written before it.
"""
from __future__ import annotations

import logging
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from common.portable import usable_cpus
from configs.video import ENCODING, VideoEncoding
from video.buffer import VideoBuffer, frames_sha256
from video.mp4 import encode_segment, write_segments

log = logging.getLogger(__name__)

MIN_SEGMENT_FRAMES = 2      # two IDR pictures in a row would need different idr_pic_ids, which x264 cannot know


@dataclass(frozen=True)
class WrittenSection:
    section: int                # 1-based
    path: Path
    frames: int
    frames_sha256: str          # of the raw uint8 frames handed to the encoder
    seconds: float              # spent in the writer on this file (blend, hash, encode, join)


def segment_groups(sizes: list[int], min_frames: int = MIN_SEGMENT_FRAMES) -> list[list[int]]:
    """Which consecutive parts are encoded as one segment: each part alone, except that a part shorter than
    `min_frames` joins the part after it (the one before it when it is the last)."""
    groups: list[list[int]] = []
    for i in range(len(sizes)):
        if groups and sum(sizes[j] for j in groups[-1]) < min_frames:
            groups[-1].append(i)
        else:
            groups.append([i])
    if len(groups) > 1 and sum(sizes[j] for j in groups[-1]) < min_frames:
        groups[-2].extend(groups.pop())
    return groups


def _lower_priority(nice: int) -> None:
    """Make the calling thread (and the encoder threads it starts, which inherit it) nicer. Linux only: elsewhere
    PRIO_PROCESS would change the whole process."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
    except OSError as e:
        log.debug("could not lower the video writer's priority: %s", e)


@dataclass
class _Task:
    pixels: torch.Tensor        # a decoded part, (1, 3, T, H, W), CPU, any float dtype
    section: int | None         # write this section's file (1-based); None: only blend (a resumed job's rebuild)
    path: Path | None


class SectionWriter:
    def __init__(self, mode: str, overlap: int, *, fps: int, crf: int, metadata: dict | None = None,
                 encoding: VideoEncoding = ENCODING):
        self.buffer = VideoBuffer(mode, overlap)
        self.fps, self.crf, self.metadata, self.encoding = fps, crf, metadata or {}, encoding
        self.busy_s = 0.0                        # total time the writer worked
        self.segments_encoded = 0                # x264 runs so far (each settled chunk once, the edge each time)
        self._tasks: queue.Queue[_Task | None] = queue.Queue()
        self._results: queue.Queue[WrittenSection | Exception] = queue.Queue()
        self._cache: dict[tuple[int | None, ...], bytes] = {}
        self._error: Exception | None = None       # the writer's first failure; later tasks are not done
        workers = encoding.parallel_segments or max(1, usable_cpus() // max(1, encoding.x264_threads))
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="video-segment",
                                        initializer=_lower_priority, initargs=(encoding.writer_nice,))
        self._thread = threading.Thread(target=self._work, name="video-writer", daemon=True)
        self._thread.start()

    # ---- the job's thread -----------------------------------------------------------------------------------
    def submit(self, pixels: torch.Tensor, section: int | None = None, path: Path | None = None) -> None:
        """Queue a decoded part; with `section` and `path`, also write the video so far to `path`."""
        self._tasks.put(_Task(pixels, section, path))

    def poll(self) -> Iterator[WrittenSection]:
        """The files written since the last call, in order, without waiting (`for written in writer.poll()`).
        Raises, in order, what failed in the writer (once)."""
        while True:
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    def finish(self) -> Iterator[WrittenSection]:
        """Like poll(), after waiting until everything submitted is done."""
        self._tasks.join()
        yield from self.poll()

    def close(self) -> None:
        """Stop the thread once it has done what was submitted (idempotent)."""
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()
        self._pool.shutdown(wait=True)

    def __len__(self) -> int:
        """Frames in the video (exact once `finish()` has returned)."""
        return len(self.buffer)

    # ---- the writer thread ----------------------------------------------------------------------------------
    def _work(self) -> None:
        _lower_priority(self.encoding.writer_nice)
        while True:
            task = self._tasks.get()
            try:
                if task is None:
                    return
                if self._error is None:
                    self._do(task)
            finally:
                self._tasks.task_done()

    def _do(self, task: _Task) -> None:
        t = time.monotonic()
        try:
            self.buffer.add(task.pixels)
            if task.section is not None and task.path is not None:      # (submit: both or neither)
                self._results.put(self._write(task.section, task.path, t))
        except Exception as e:  # kept for the job's thread, which fails the job with it; later tasks are skipped
            log.error("video writer: %s", e, exc_info=True)
            self._error = e
            self._results.put(e)
        finally:
            self.busy_s += time.monotonic() - t

    def _write(self, section: int, path: Path, started: float) -> WrittenSection:
        parts = self.buffer.parts()
        digest = frames_sha256(parts)
        groups = segment_groups([frames.shape[0] for _, frames in parts])
        jobs = {}
        for group in groups:
            keys = tuple(parts[i][0] for i in group)
            if None in keys or keys not in self._cache:
                frames = np.concatenate([parts[i][1] for i in group]) if len(group) > 1 else parts[group[0]][1]
                jobs[keys] = self._pool.submit(encode_segment, frames, fps=self.fps, crf=self.crf,
                                               encoding=self.encoding)
        encoded = {keys: job.result() for keys, job in jobs.items()}
        self.segments_encoded += len(encoded)
        for keys, data in encoded.items():
            if None not in keys:
                self._cache[keys] = data
        segments = []
        for group in groups:
            keys = tuple(parts[i][0] for i in group)
            segments.append(encoded[keys] if keys in encoded else self._cache[keys])
        write_segments(segments, path, fps=self.fps, metadata=self.metadata)
        frames = sum(f.shape[0] for _, f in parts)
        return WrittenSection(section, path, frames, digest, time.monotonic() - started)

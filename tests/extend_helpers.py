"""Helpers for the extension tests (tests/test_extend*.py, test_keyframes.py, test_loop.py, the queue and browser
tests that extend a video): the default window and its seam, a request's common settings, videos written from
frames, a job run to its end, and an interrupted extension stopped, resumed and compared with the whole job."""
from __future__ import annotations

import json
from fractions import Fraction

import av
import numpy as np
import torch

from jobfolder.checkpoint import load_checkpoint
from pipeline import sections as sec
from pipeline.cancel import CancelToken
from pipeline.events import Done, Progress
from pipeline.orchestrator import generate
from pipeline.request import prepare
from pipeline.resume import prepare_resume, resume
from tests.conftest import make_image

W = 9                                                   # the default latent window
OVERLAP = sec.overlap_frames(W)                         # 33 frames cross-faded at the seam
COMMON = dict(prompt="a lighthouse in a storm", steps=3, seed=7, mode="f1", teacache=0.0)


def write_video(path, frames, fps=30, *, times=None, rotation=None, codec="libx264"):
    """Frames (T, H, W, 3) uint8 as a video; `times` (seconds) for a variable frame rate."""
    with av.open(str(path), "w") as c:
        s = c.add_stream(codec, rate=fps)
        s.height, s.width = frames.shape[1:3]
        s.pix_fmt = "yuv420p"
        if times is not None:
            s.codec_context.time_base = Fraction(1, 1000)
        if rotation is not None:
            s.set_display_rotation(rotation)
        for i, f in enumerate(frames):
            vf = av.VideoFrame.from_ndarray(f, format="rgb24")
            if times is not None:
                vf.pts, vf.time_base = int(round(times[i] * 1000)), Fraction(1, 1000)
            for p in s.encode(vf):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return path


def moving_frames(count, width=100, height=70, seed=0):
    """`count` frames (T, H, W, 3) uint8 of a test image twice as wide, the view moving one pixel a frame."""
    base = np.asarray(make_image(width * 2, height, seed=seed))
    return np.stack([base[:, i % width: i % width + width] for i in range(count)])


def run(request, components, outputs):
    """Prepare `request` and run the job to its end; returns its Done event (a job that did not finish fails)."""
    events = list(generate(prepare(request, components.preset.default_resolution), components, outputs=outputs))
    assert type(events[-1]).__name__ == "Done", events[-1]
    return events[-1]


def stopped_after_first_section(request, components, outputs):
    """Run `request` (an extension, or a new job), pressing End as soon as its first new section is saved (its
    decode begins): (job folder, sections done at the stop)."""
    cancel = CancelToken()
    events = []
    prepared = prepare(request, components.preset.default_resolution)
    first_new = (prepared.source.sections_done if prepared.source is not None else 0) + 1
    for event in generate(prepared, components, cancel=cancel, outputs=outputs):
        events.append(event)
        if isinstance(event, Progress) and event.stage == "VAE decode" and event.section == first_new:
            cancel.cancel()
    done = events[-1]
    assert isinstance(done, Done) and done.stopped, done
    return done.job_dir, load_checkpoint(done.job_dir)[1]["sections_done"]


def resumed(job_dir, components):
    """The stopped job in `job_dir` resumed to its end; returns its Done event."""
    events = list(resume(prepare_resume(job_dir), components))
    assert isinstance(events[-1], Done) and not events[-1].stopped, events[-1]
    return events[-1]


def assert_same(job_dir, full_dir):
    """The resumed job in `job_dir` is the uninterrupted one in `full_dir`: the same latents, random state, last
    section's frames and mp4 bytes."""
    a, b = load_checkpoint(job_dir), load_checkpoint(full_dir)
    for key in ("history", "real", "start_latent", "rng_state"):
        torch.testing.assert_close(a[0][key], b[0][key], atol=0, rtol=0)
    info, full = (json.loads((d / "job.json").read_text()) for d in (job_dir, full_dir))
    assert info["status"] == "done" and info["resumed"] == 1
    assert info["sections"][-1]["frames_sha256"] == full["sections"][-1]["frames_sha256"]
    assert (job_dir / "final.mp4").read_bytes() == (full_dir / "final.mp4").read_bytes()

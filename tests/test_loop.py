"""The loop switch (configs/controls.py "loop", video/loop.py): the video returns to its first frame, on the tiny
preset: the original mode ends at the start image (its latent as the end frame) and the seam is blended; the first
and last frames are closer than without the switch, and job.json records it."""
from __future__ import annotations

import json

import numpy as np
import pytest

from common.errors import InputError
from pipeline.request import Request, prepare
from tests.conftest import make_image
from tests.extend_helpers import run
from video.loop import SEAM_FRAMES, seam_blend
from video.mp4 import read_frames

COMMON = dict(prompt="waves roll in", steps=2, seed=3, mode="original", teacache=0.0, seconds=2.4, crf=10)


def test_the_seam_blend_moves_the_last_frames_toward_the_first():
    frames = np.zeros((20, 4, 4, 3), np.uint8)
    frames[0] = 200
    out = seam_blend(frames, 4)
    assert np.array_equal(out[:16], frames[:16])                     # untouched before the seam
    assert [int(out[k, 0, 0, 0]) for k in range(16, 20)] == [40, 80, 120, 160]     # 1/5 … 4/5 of the first frame
    assert np.array_equal(seam_blend(frames[:1], 4), frames[:1])


def _distance(video) -> float:
    frames = read_frames(video).astype(np.float32)
    return float(np.abs(frames[0] - frames[-1]).mean())


def test_a_loop_video_ends_closer_to_its_first_frame(tiny_original, tmp_path):
    image = tmp_path / "start.png"
    make_image(96, 72, seed=4).save(image)
    plain = run(Request(image=image, **COMMON), tiny_original, tmp_path / "plain")
    looped = run(Request(image=image, loop="on", **COMMON), tiny_original, tmp_path / "loop")
    assert looped.frames == plain.frames
    near, far = _distance(looped.video), _distance(plain.video)
    assert near < 0.5 * far, (near, far)
    info = json.loads((looped.job_dir / "job.json").read_text())
    assert info["settings"]["loop"] == "on"
    assert info["loop"] == {"seam_frames": SEAM_FRAMES, "end_frame": "start image"}
    assert "loop" not in json.loads((plain.job_dir / "job.json").read_text())
    with pytest.raises(InputError, match="remove the end image") as e:
        prepare(Request(image=image, end_image=image, loop="on", **COMMON), 64)
    assert e.value.field == "loop"

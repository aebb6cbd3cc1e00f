"""An interrupted extension (pipeline/extend_resume.py) resumes to the very result of an uninterrupted one, on the
tiny preset: the same latents, random state, raw frames (their sha256) and mp4 bytes. The input video is read
from the job folder's own copy (the user's file may be gone by then); a changed copy is refused."""
from __future__ import annotations

import json

import pytest

from common.errors import InputError
from pipeline.request import Request
from pipeline.resume import prepare_resume
from tests.conftest import make_image
from tests.extend_helpers import (
    COMMON,
    W,
    assert_same,
    moving_frames,
    resumed,
    run,
    stopped_after_first_section,
    write_video,
)
from video.mp4 import read_frames


def test_an_interrupted_video_extension_resumes_bit_identically(tiny_f1, tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(50), codec="libx264")
    request = Request(input_video=clip, seconds=2.4, **COMMON)              # two new sections after the input
    full = run(request, tiny_f1, tmp_path / "full")
    job_dir, done_at_stop = stopped_after_first_section(request, tiny_f1, tmp_path / "cut")
    source = json.loads((job_dir / "job.json").read_text())["source"]
    assert done_at_stop == source["sections_as_context"] + 1               # the input's context + one new section
    assert (job_dir / source["kept"]).read_bytes() == clip.read_bytes()     # the folder keeps the input video
    clip.unlink()                                                           # the user's file is gone
    done = resumed(job_dir, tiny_f1)
    assert_same(job_dir, full.job_dir)
    assert done.frames == full.frames == 50 + 2 * 4 * W
    assert read_frames(job_dir / "final.mp4").shape[0] == done.frames


def test_an_extension_whose_video_changed_is_refused(tiny_f1, tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(50), codec="libx264")
    job_dir, _ = stopped_after_first_section(Request(input_video=clip, seconds=2.4, **COMMON), tiny_f1, tmp_path)
    kept = job_dir / json.loads((job_dir / "job.json").read_text())["source"]["kept"]
    write_video(kept, moving_frames(50, seed=9), codec="libx264")         # another video under the same names
    write_video(clip, moving_frames(50, seed=9), codec="libx264")
    with pytest.raises(InputError, match="sha256 differs"):
        prepare_resume(job_dir)


def test_an_interrupted_job_extension_resumes_to_the_longer_job(tiny_f1, tmp_path):
    image = tmp_path / "in.png"
    make_image(128, 96, seed=5).save(image)
    short = run(Request(image=image, seconds=2.4, **COMMON), tiny_f1, tmp_path / "short")
    longer = run(Request(image=image, seconds=4.8, **COMMON), tiny_f1, tmp_path / "long")
    job_dir, done_at_stop = stopped_after_first_section(Request(input_video=short.job_dir, seconds=2.4, **COMMON),
                                                        tiny_f1, tmp_path / "ext")
    assert done_at_stop == 3
    resumed(job_dir, tiny_f1)
    assert_same(job_dir, longer.job_dir)

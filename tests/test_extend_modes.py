"""The original mode's extensions (pipeline/extend.py) and the context frames control, on the tiny preset.

- backward: the new part goes before the input video; the output ends with the input's frames (all but the first
  overlap − 1, which cross-fade into the new part, kept bit for bit: compared through the mp4 as in
  tests/test_extend.py), and the same seed gives the same latents.
- toward an end frame: the new part goes after the input and is conditioned on the end image; the output starts
  with all the input's frames, bit for bit.
- context frames: only that many of the input's latents reach the transformer (pure: `limited_history`, the prefix
  of `SectionPlan.indices`); fewer gives another video; out of range is refused naming the field.
- an interrupted extension of either kind resumes to the very result of an uninterrupted one.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common.errors import InputError
from jobfolder.checkpoint import load_checkpoint
from pipeline import extend
from pipeline import sections as sec
from pipeline.request import Request, prepare
from tests.conftest import make_image
from tests.extend_helpers import (
    OVERLAP,
    W,
    assert_same,
    moving_frames,
    resumed,
    run,
    stopped_after_first_section,
    write_video,
)
from video.buffer import VideoBuffer
from video.mp4 import encode_segment, read_frames

COMMON = dict(prompt="the tide comes in", steps=2, seed=11, mode="original", teacache=0.0, seconds=1.2, crf=10)


# ---- pure pieces ---------------------------------------------------------------------------------------------
def test_context_frames_limit_what_the_transformer_reads():
    f1 = sec.SectionPlan("f1", W, 3)
    history = torch.arange(1, 19 + 2 * W + 1 + 1, dtype=torch.float32).view(1, 1, -1, 1, 1)    # 19 + input 19
    seen = extend.limited_history(f1, history, 2, 5)
    assert seen[0, 0, :, 0, 0].tolist() == [*range(1, 20)] + [0] * 14 + [*range(34, 39)]      # its newest 5
    assert extend.limited_history(f1, history, 2, 19) is history and history[0, 0, 20] == 21  # unchanged
    assert extend.context_count(0, extend.FORWARD) == extend.context_count(0, extend.BACKWARD) == 19   # automatic
    assert extend.context_count(0, extend.TO_END) == 5 and extend.context_count(7, extend.TO_END) == 7
    original = sec.SectionPlan("original", W, 3)
    history = torch.arange(1, 2 * W + 19 + 1, dtype=torch.float32).view(1, 1, -1, 1, 1)          # input 18 + 19
    seen = extend.limited_history(original, history, 2, 3)
    assert seen[0, 0, :, 0, 0].tolist() == [1, 2, 3] + [0] * 15 + [*range(19, 38)]             # its first 3
    plain = original.indices(original.sections[-1])
    shifted = original.indices(original.sections[-1], prefix=4)
    assert plain.clean == [0, 10] and shifted.clean == [0, 1, 2, 3, 13]
    assert shifted.latents == [i + 3 for i in plain.latents] and shifted.history_4x[-1] == plain.history_4x[-1] + 3


def test_finished_frames_lead_an_original_video():
    frames = np.random.RandomState(1).randint(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    buf = VideoBuffer("original", OVERLAP)
    buf.add(torch.rand(1, 3, 4 * W + 1, 8, 8) * 2 - 1)
    after = buf.frames()
    buf.add(frames)                              # toward an end frame: the input goes first, its last frame once
    assert np.array_equal(buf.frames(), np.concatenate([frames, after[1:]]))


def test_context_frames_out_of_range_are_refused_naming_the_field(tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(40))
    for bad in (-1, 20, 2.5):
        with pytest.raises(InputError) as e:
            prepare(Request(input_video=clip, context_frames=bad, **COMMON), 64)
        assert e.value.field == "context frames", e.value
    assert "between 0 and 19" in str(pytest.raises(InputError, prepare,
                                                   Request(input_video=clip, context_frames=20, **COMMON), 64).value)


# ---- on the tiny preset ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    root = tmp_path_factory.mktemp("modes")
    return write_video(root / "clip.mp4", moving_frames(40, 64, 48, seed=3)), root


def _latents(done):
    tensors, _ = load_checkpoint(done.job_dir)
    return tensors["real"]


def test_backward_extension_ends_with_the_input_video(clip, tiny_original):
    path, root = clip
    prepared = prepare(Request(input_video=path, **COMMON), 64)
    frames_in = prepared.source.frames
    assert prepared.source.direction == extend.BACKWARD and prepared.source.sections_done == 1
    assert np.array_equal(np.asarray(prepared.image), frames_in[0])        # the start image: its first frame
    done = run(prepared.request, tiny_original, root / "a")
    assert done.frames == len(frames_in) + 4 * W + 4      # the new section (with the start latent), then the input
    out = read_frames(done.video)
    kept = len(frames_in) - OVERLAP
    alone = root / "alone.mp4"
    alone.write_bytes(encode_segment(frames_in[OVERLAP:], crf=10))
    assert np.array_equal(out[-kept:], read_frames(alone))          # the input's frames, untouched (decoded alike)
    info = json.loads((done.job_dir / "job.json").read_text())
    assert info["source"]["direction"] == "backward" and info["source"]["encoded_frames"] == 4 * (W - 1) + 1
    again = run(prepared.request, tiny_original, root / "b")               # the same seed: the same latents
    torch.testing.assert_close(_latents(again), _latents(done), atol=0, rtol=0)
    fewer = run(Request(input_video=path, context_frames=2, **COMMON), tiny_original, root / "c")
    assert not torch.equal(_latents(fewer)[:, :, :W], _latents(done)[:, :, :W])     # it saw less of the input
    assert json.loads((fewer.job_dir / "job.json").read_text())["settings"]["context_frames"] == 2


def test_extension_toward_an_end_frame(clip, tiny_original):
    path, root = clip
    end = root / "end.png"
    make_image(96, 72, seed=9).save(end)
    request = Request(input_video=path, end_image=end, context_frames=3, **COMMON)
    prepared = prepare(request, 64)
    frames_in = prepared.source.frames
    assert prepared.source.direction == extend.TO_END and prepared.source.sections_done == 0
    assert prepared.end_image.size == (64, 48) and np.array_equal(np.asarray(prepared.image), frames_in[-1])
    done = run(request, tiny_original, root / "end")
    assert done.frames == len(frames_in) + 4 * W          # the input, then the new section (its start frame once)
    out = read_frames(done.video)
    alone = root / "alone_end.mp4"
    alone.write_bytes(encode_segment(frames_in[OVERLAP:], crf=10))
    assert np.array_equal(out[OVERLAP:len(frames_in)], read_frames(alone))   # the input's frames, bit for bit
    tensors, _ = load_checkpoint(done.job_dir)
    assert tensors["end_latent"] is not None and tensors["history"].shape[2] == W + 1 + 19 + 3   # + the prefix
    info = json.loads((done.job_dir / "job.json").read_text())
    assert info["source"]["direction"] == "to end frame" and (done.job_dir / "end.png").is_file()


@pytest.mark.parametrize("toward_end", [False, True], ids=["backward", "toward an end frame"])
def test_an_interrupted_extension_resumes_bit_identically(clip, tiny_original, toward_end):
    path, root = clip
    root = root / f"resume-{toward_end}"
    more = {}
    if toward_end:
        more = dict(end_image=root.parent / "end2.png", context_frames=2)
        make_image(96, 72, seed=4).save(more["end_image"])
    request = Request(input_video=path, **{**COMMON, "seconds": 2.4}, **more)     # two new sections
    full = run(request, tiny_original, root / "full")
    job_dir, _ = stopped_after_first_section(request, tiny_original, root / "cut")
    resumed(job_dir, tiny_original)
    assert_same(job_dir, full.job_dir)

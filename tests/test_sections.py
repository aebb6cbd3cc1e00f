"""Section planning: pure bookkeeping, checked against docs/FACTS.md without models."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline import sections as sec
from video.buffer import VideoBuffer
from video.mp4 import pixels_to_frames


@pytest.mark.parametrize("seconds,window,expected", [
    (5, 9, 4), (1, 9, 1), (0.1, 9, 1), (2.4, 9, 2), (60, 9, 50), (120, 9, 100), (5, 5, 8), (1.2, 9, 1),
])
def test_section_count(seconds, window, expected):
    assert sec.section_count(seconds, window) == expected


@pytest.mark.parametrize("n,expected", [
    (1, [0]), (2, [1, 0]), (3, [2, 1, 0]), (4, [3, 2, 1, 0]), (5, [3, 2, 2, 1, 0]), (7, [3, 2, 2, 2, 2, 1, 0]),
])
def test_latent_paddings(n, expected):
    assert sec.latent_paddings(n) == expected


def test_frame_counts_match_framepack():
    # docs/FACTS.md: output after n sections: 33, 69, 105, 145 ... at window 9 (original mode, 4 sections).
    assert sec.SectionPlan("original", 9, 4).frame_counts() == [33, 69, 105, 145]
    assert sec.SectionPlan("original", 9, 1).frame_counts() == [37]        # start latent + one window
    assert sec.SectionPlan("f1", 9, 3).frame_counts() == [37, 73, 109]
    assert sec.overlap_frames(9) == 33


@pytest.mark.parametrize("mode", ["original", "f1"])
@pytest.mark.parametrize("window", [9, 5, 1])
def test_indices_layout(mode, window):
    plan = sec.SectionPlan(mode, window, 5)
    for s in plan.sections:
        idx = plan.indices(s)
        assert len(idx.latents) == window and len(idx.clean) == 2
        assert len(idx.history_2x) == 2 and len(idx.history_4x) == 16
        everything = sorted([0, *idx.latents, idx.clean[1], *idx.history_2x, *idx.history_4x])
        assert len(set(everything)) == len(everything)                    # no index used twice
        if mode == "original":
            # [prefix | blank pad | window | post | 2x | 4x]: the window starts after the padding
            assert idx.latents[0] == 1 + s.padding * window
            assert idx.clean[1] == idx.latents[-1] + 1 == idx.history_2x[0] - 1
        else:
            assert idx.history_4x == list(range(1, 17)) and idx.clean == [0, 19]
            assert idx.latents[0] == 20


def _latents(t, fill):
    return torch.full((1, 16, t, 2, 2), float(fill))


def test_history_bookkeeping_original_mode():
    plan = sec.SectionPlan("original", 3, 3)
    start = _latents(1, 7.0)
    history = sec.empty_history(plan, start)
    assert history.shape[2] == 19 and history.abs().sum() == 0
    end = _latents(1, 9.0)
    for s, fill in zip(plan.sections, (1.0, 2.0, 3.0)):
        ctx = sec.section_context(plan, s, history, start, end)
        assert torch.equal(ctx.clean[:, :, 0], start[:, :, 0])
        post = ctx.clean[:, :, 1]
        if s.is_first:
            assert torch.equal(post, end[:, :, 0])                       # the end image takes the post slot
        else:
            assert float(post.mean()) == fill - 1.0                       # the section generated just before
        history, real = sec.append_section(plan, s, history, _latents(3, fill), start)
    # video order: start latent, then sections in reverse generation order
    assert [float(real[0, 0, i, 0, 0]) for i in range(real.shape[2])] == [7, 3, 3, 3, 2, 2, 2, 1, 1, 1]
    assert real.shape[2] == plan.real_latent_frames(plan.sections[-1])


def test_history_bookkeeping_f1_mode():
    plan = sec.SectionPlan("f1", 3, 2)
    start = _latents(1, 7.0)
    history = sec.empty_history(plan, start)
    assert history.shape[2] == 20
    for s, fill in zip(plan.sections, (1.0, 2.0)):
        ctx = sec.section_context(plan, s, history, start)
        expected_last = 7.0 if s.is_first else fill - 1.0
        assert float(ctx.clean[0, 0, 1, 0, 0]) == expected_last           # 1x = the newest latent
        history, real = sec.append_section(plan, s, history, _latents(3, fill), start)
    assert [float(real[0, 0, i, 0, 0]) for i in range(real.shape[2])] == [7, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize("mode", ["original", "f1"])
def test_real_latents_after_any_earlier_section_whatever_was_done_since(mode):
    """A resume decodes each finished section from the latest checkpoint's real latents: cut from those, they are
    the real latents right after that section, also once the last section (original mode: the start latent in
    front) is done."""
    plan = sec.SectionPlan(mode, 3, 4)
    start = _latents(1, 7.0)
    history, reals = sec.empty_history(plan, start), []
    for s in plan.sections:
        history, real = sec.append_section(plan, s, history, _latents(3, s.index + 1.0), start)
        reals.append(real)
    for done in range(1, plan.count + 1):
        for s in plan.sections[:done]:
            assert torch.equal(sec.real_latents_after(plan, s, reals[done - 1], done), reals[s.index]), (done, s)


def test_soft_append_is_a_linear_crossfade():
    a = torch.zeros(1, 1, 5, 1, 1)
    b = torch.ones(1, 1, 4, 1, 1)
    out = sec.soft_append(a, b, 3)
    assert out.shape[2] == 5 + 4 - 3
    assert out.flatten().tolist() == pytest.approx([0, 0, 0, 0.5, 1, 1])
    with pytest.raises(ValueError):
        sec.soft_append(a, torch.ones(1, 1, 2, 1, 1), 3)


@pytest.mark.parametrize("mode", ["original", "f1"])
def test_video_buffer_equals_blending_everything_in_float(mode):
    plan = sec.SectionPlan(mode, 3, 4)
    gen = torch.Generator().manual_seed(0)
    buffer = VideoBuffer(mode, sec.overlap_frames(plan.window))
    full = None
    for s in plan.sections:
        frames = sec.pixel_frames(plan.decode_frames(s))
        part = torch.rand((1, 3, frames, 4, 6), generator=gen) * 2 - 1
        buffer.add(part)
        full = sec.join_video(plan, full, part)
        assert len(buffer) == full.shape[2] == plan.video_frames_after(s)
    np.testing.assert_array_equal(buffer.frames(), pixels_to_frames(full))


@pytest.mark.parametrize("args, words", [
    (("F1", 5.0, 9), "mode: 'F1' is not one of 'original', 'f1'"),
    (("f1", True, 9), "seconds: a number is required, got True"),
    (("f1", "five", 9), "seconds: 'five' is not a number"),
    (("f1", float("nan"), 9), "seconds: nan is not between"),
    (("original", 5.0, 9.5), "latent window: 9.5 is not a whole number between"),
])
def test_a_plan_of_values_beyond_the_limits_is_refused_naming_the_field(args, words):
    with pytest.raises(ValueError) as e:
        sec.make_plan(*args)
    assert str(e.value).startswith(words), str(e.value)


def test_frames_after_a_section_that_is_not_in_the_plan_is_an_index_error():
    plan = sec.make_plan("original", 5.0, 9)
    assert plan.frames_after(plan.count - 1) == plan.total_frames
    with pytest.raises(IndexError, match=f"section {plan.count} of a {plan.count}-section plan"):
        plan.frames_after(plan.count)

"""Keyframes (pipeline/keyframes.py): images at chosen times of an original-mode video, on the tiny preset.

- pure: the setting's two forms, its refusals (F1, 0 s, the end, too close, bad strength), which keyframe governs
  each section (the one in effect at the section's middle);
- a keyframe's VAE latent is the start slot (FramePack's clean_latents_pre) of exactly the sections it governs, and
  its strength blends it with the start latent;
- a keyframe job is deterministic, resumes bit-identically, and its video extends like any other;
- the doors: a batch line / job.json key, the CLI's --keyframe.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from common.errors import InputError
from jobfolder.checkpoint import keyframe_latents, load_checkpoint
from pipeline import keyframes as kf
from pipeline import sections as sec
from pipeline.denoiser import FramepackDenoiser
from pipeline.request import Request, prepare
from tests.conftest import make_image
from tests.extend_helpers import assert_same, resumed, run, stopped_after_first_section

W = 9
# 3.6 s at window 9, 30 fps: 3 sections of 1.2 s; their middles at 0.62, 1.82, 3.02 s (video order)
COMMON = dict(prompt="a kite over a beach", steps=2, seed=5, mode="original", teacache=0.0, seconds=3.6)


# ---- pure -----------------------------------------------------------------------------------------------------
def test_the_two_forms_and_the_refusals():
    a = kf.parse("[2.5s] middle.png [4s, 0.8] other.png")
    assert a == kf.parse("4:0.8=other.png, 2.5=middle.png")              # the CLI's form, sorted by time
    assert a == (kf.Keyframe(2.5, "middle.png"), kf.Keyframe(4.0, "other.png", 0.8))
    assert kf.parse(kf.spec(a)) == a and kf.parse("") == ()
    for bad, words in [("[2x] a.png", "is not a time"), ("[1s] a.png [1s] b.png", "two keyframes at 1s"),
                       ("[1s, 3] a.png", "strength '3' is not a number from 0 to 1"), ("a.png", "write TIME=FILE"),
                       ("[1s]", "names no image")]:
        with pytest.raises(InputError, match=words) as e:
            kf.parse(bad)
        assert e.value.field == "keyframes"
    for spec, mode, words in [("[2s] a.png", "f1", "the F1 mode has no keyframes"),
                              ("[0s] a.png", "original", "is the start image"),
                              ("[4.9s] a.png", "original", "it is the end frame"),
                              ("[2s] a.png [2.3s] b.png", "original", "governs no section")]:
        with pytest.raises(InputError, match=words):
            kf.check(spec, mode, W, 4, 30)


def test_the_keyframe_in_effect_at_a_sections_middle_governs_it():
    # generation order of the original mode: the end first (index 0 = video position 3)
    assert kf.governing_keyframes([1.0, 3.0], "original", W, 4, 30) == [1, 1, 0, None]
    assert kf.governing_keyframes([2.0], "original", W, 4, 30) == [0, 0, None, None]
    assert kf.governing_keyframes([1.5, 3.0], "original", W, 3, 30) == [1, 0, None]       # the jobs below
    start, key = torch.zeros(1, 2, 1, 2, 2), torch.ones(1, 2, 1, 2, 2)
    assert torch.equal(sec.blend_latents(start, key, 1.0), key)
    assert torch.allclose(sec.blend_latents(start, key, 0.25), torch.full_like(key, 0.25))


# ---- on the tiny preset -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def images(tmp_path_factory):
    root = tmp_path_factory.mktemp("kf")
    for name, seed in (("start.png", 1), ("middle.png", 2), ("late.png", 3)):
        make_image(96, 72, seed=seed).save(root / name)
    return root


def _request(images, spec="[1.5s] {r}/middle.png [3s, 0.5] {r}/late.png", **more):
    return Request(image=images / "start.png", keyframes=spec.format(r=images), **COMMON, **more)


@pytest.fixture(scope="module")
def first(images, tiny_original, tmp_path_factory):
    """A keyframe job, with the start slot of each section's transformer call recorded: (Done, the slots)."""
    seen = []
    begin = FramepackDenoiser.begin_section

    def spy(self, ctx, *args, **kwargs):
        seen.append(ctx.clean[:, :, :1].clone())           # the start slot, at RoPE index 0
        return begin(self, ctx, *args, **kwargs)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(FramepackDenoiser, "begin_section", spy)
        done = run(_request(images), tiny_original, tmp_path_factory.mktemp("first"))
    return done, seen


def test_a_keyframes_latent_conditions_the_sections_it_governs_and_no_other(first):
    done, seen = first
    tensors, _ = load_checkpoint(done.job_dir)
    start, (middle, late) = tensors["start_latent"], keyframe_latents(tensors)
    assert not torch.equal(middle, start) and not torch.equal(late, middle)
    # generation order: positions 2, 1, 0 (middles 3.02, 1.82, 0.62 s)
    assert len(seen) == 3
    torch.testing.assert_close(seen[0], torch.lerp(start, late, 0.5), atol=0, rtol=0)       # 3 s at strength 0.5
    torch.testing.assert_close(seen[1], middle, atol=0, rtol=0)                             # 1.5 s, strength 1
    torch.testing.assert_close(seen[2], start, atol=0, rtol=0)                              # before any keyframe
    info = json.loads((done.job_dir / "job.json").read_text())
    assert [k["time"] for k in info["keyframes"]] == [1.5, 3.0] and (done.job_dir / "keyframe_2.png").is_file()
    assert "[1.5s]" in info["settings"]["keyframes"]


def test_a_keyframe_job_is_deterministic_resumes_bit_identically_and_extends(images, tiny_original, tmp_path,
                                                                              first):
    request = _request(images)
    full = run(request, tiny_original, tmp_path / "full")
    assert (full.job_dir / "final.mp4").read_bytes() == (first[0].job_dir / "final.mp4").read_bytes()
    job_dir, done_at_stop = stopped_after_first_section(request, tiny_original, tmp_path / "cut")
    assert done_at_stop == 1
    (images / "middle.png").rename(images / "gone.png")          # resume reads the job folder's copies
    try:
        resumed(job_dir, tiny_original)
    finally:
        (images / "gone.png").rename(images / "middle.png")
    assert_same(job_dir, full.job_dir)
    for a, b in zip(keyframe_latents(load_checkpoint(job_dir)[0]), keyframe_latents(load_checkpoint(full.job_dir)[0])):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    # its video extends like any other (backwards in the original mode)
    longer = run(Request(input_video=full.video, prompt="more", steps=2, seed=5, mode="original", teacache=0.0,
                         seconds=1.2), tiny_original, tmp_path / "ext")
    assert longer.frames > full.frames
    with pytest.raises(InputError, match="extending a video has none"):
        prepare(Request(input_video=full.video, keyframes=f"[1s] {images}/middle.png", **COMMON), 64)


def test_the_doors_batch_line_and_cli(images, tmp_path):
    line = {"image": "start.png", "keyframes": "[1.5s] middle.png", **COMMON}
    prepared = prepare(Request.from_mapping(line, base=images), 64)       # a batch line's relative path
    assert [k.time for k, _ in prepared.keyframes] == [1.5]
    assert prepared.keyframes[0][1].size == prepared.image.size
    from cli.commands import build_parser, request_from_args

    args = build_parser().parse_args(["generate", "--image", str(images / "start.png"), "--prompt", "x",
                                      "--keyframe", f"1.5={images}/middle.png", "--keyframe",
                                      f"3:0.5={images}/late.png"])
    request = request_from_args(args)
    assert [(k.time, k.strength) for k in kf.parse(request.keyframes)] == [(1.5, 1.0), (3.0, 0.5)]
    with pytest.raises(InputError, match="the F1 mode has no keyframes") as e:
        prepare(Request.from_mapping({**line, "mode": "f1"}, base=images), 64)
    assert e.value.field == "keyframes"
    with pytest.raises(InputError, match="the keyframe at 1.5s") as e:
        prepare(Request.from_mapping({**line, "keyframes": "[1.5s] missing.png"}, base=images), 64)


def test_the_app_reads_no_keyframe_it_was_not_sent(images):
    """The app's doors (/queue_add, /queue_edit, a jobs file sent to it) take keyframe images only as uploads."""
    from jobs.doors import admitted
    from tests.conftest import uploaded
    from ui import settings as st

    with pytest.raises(InputError, match="only a file uploaded to this app") as e:
        admitted({"keyframe": f"[1.5s] {images}/middle.png"}, st.UPLOADS)         # (the alias too)
    assert e.value.field == "keyframes"
    sent = uploaded(images / "middle.png")
    assert kf.parse(admitted({"keyframes": f"[1.5s, 0.5] {sent}"}, st.UPLOADS)["keyframes"]) == \
        (kf.Keyframe(1.5, str(Path(sent).resolve()), 0.5),)


def test_start_and_end_keyframes_are_the_start_and_end_images(images):
    """`[0s] start.png [1.5s] middle.png [3.6s] late.png`: the whole request's images in one setting."""
    line = {"keyframes": "[0s] start.png [1.5s] middle.png [3.6s] late.png", **COMMON}
    request = Request.from_mapping(line, base=images)
    assert Path(request.image) == images / "start.png" and Path(request.end_image) == images / "late.png"
    assert kf.parse(request.keyframes) == (kf.Keyframe(1.5, str(images / "middle.png")),)
    prepared = prepare(request, 64)
    assert prepared.end_image is not None and len(prepared.keyframes) == 1
    with pytest.raises(InputError, match="a start image is given too"):       # both ways: refused, saying so
        prepare(Request.from_mapping({**line, "image": "start.png"}, base=images), 64)


def test_reuse_settings_gives_the_keyframes_the_job_folder_kept(first):
    """Reuse settings of a keyframe job: its times and strengths, with servable copies of the folder's images."""
    from ui.jobs_gallery import JobEntry
    from ui.panel_jobs import reused_keyframes

    done, _ = first
    info = json.loads((done.job_dir / "job.json").read_text())
    text = reused_keyframes(JobEntry(done.job_dir, info), info["settings"]["keyframes"])
    items = kf.parse(text)
    assert [(k.time, k.strength) for k in items] == [(1.5, 1.0), (3.0, 0.5)]
    assert all(Path(k.image).is_file() and Path(k.image).read_bytes() == (done.job_dir / f"keyframe_{i}.png")
               .read_bytes() for i, k in enumerate(items, 1))


def test_more_malformed_keyframes_are_said_and_left_to_the_check_by_the_batch_readers(tmp_path):
    many = " ".join(f"[{t}s] k{t}.png" for t in range(1, kf.MAX_KEYFRAMES + 2))
    for bad, words in [("[1s, x] a.png", "the strength 'x' is not a number from 0 to 1"),
                       (5, "must be text, like [2.5s] middle.png"),
                       ("[1s] a.png ]x", "']x': write each keyframe as [time] file"),
                       (many, f"{kf.MAX_KEYFRAMES + 1} keyframes; at most {kf.MAX_KEYFRAMES}")]:
        with pytest.raises(InputError) as e:
            kf.parse(bad)
        assert e.value.field == "keyframes" and words in e.value.message, e.value.message
    assert kf.parse(None) == ()
    # a batch line's keyframes: relative to its file's folder when they parse, else kept for the check to explain
    assert kf.relative_to("[1s] a.png", tmp_path) == f"[1s] {tmp_path / 'a.png'}"
    assert kf.relative_to("[1s, x] a.png", tmp_path) == "[1s, x] a.png"
    assert kf.split_ends({"keyframes": "[1s, x] a.png"}, 5.0) == {}

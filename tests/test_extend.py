"""Extending a video (pipeline/extend.py, pipeline/video_input.py) on the tiny preset.

What is exactly testable, and tested so:
- a finished F1 job extended by N sections (same seed and settings) IS the job run with N more sections: the same
  latents, random state, raw frames (their sha256) and mp4 bytes. The history read from its folder equals the
  history the longer job had at that point. (Its checkpoint is the job's own history; the RNG goes on from the
  saved state; the sections are decoded again so the seam's cross-fade is the longer job's.)
- an input video file's frames are kept bit for bit (but the last overlap − 1, the seam's cross-fade): the output
  mp4, decoded, equals the input's frames encoded alone by the same encoder and decoded (H.264 decoding is exact;
  the comparison of raw frames is in test_start_with_keeps_the_frames_bit_for_bit).
Not exactly testable: a video file made by a job, extended, against the longer job: the VAE re-encode of decoded
(and H.264-compressed) frames is not the job's latents.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from common.errors import InputError
from common.files import file_sha256
from jobfolder.checkpoint import load_checkpoint
from pipeline import sections as sec
from pipeline.extend import load_source, min_frames
from pipeline.request import Request, prepare
from pipeline.video_input import resample
from tests.cli_helpers import cli
from tests.conftest import job_folders, make_image
from tests.extend_helpers import COMMON, OVERLAP, W, moving_frames, run, write_video
from tests.video_helpers import audio_only
from video.buffer import VideoBuffer
from video.mp4 import encode_segment, read_frames


# ---- pure pieces ---------------------------------------------------------------------------------------------
def test_start_with_keeps_the_frames_bit_for_bit():
    frames = np.random.RandomState(0).randint(0, 256, (40, 8, 8, 3), dtype=np.uint8)
    frames[:, 0, 0, 0] = np.arange(40)           # and every value 0..255 somewhere in the edge
    frames[-OVERLAP:, 1, :, :] = np.arange(256, dtype=np.uint8)[:OVERLAP * 24].reshape(OVERLAP, 8, 3) \
        if OVERLAP * 24 <= 256 else np.resize(np.arange(256, dtype=np.uint8), (OVERLAP, 8, 3))
    buf = VideoBuffer("f1", OVERLAP)
    buf.add(frames)
    assert np.array_equal(buf.frames(), frames)
    assert buf.parts()[0][1].shape[0] == 40 - OVERLAP
    backward = VideoBuffer("original", OVERLAP)          # the original mode: new parts go before them
    backward.add(frames)
    assert np.array_equal(backward.frames(), frames) and backward.parts()[1][1].shape[0] == 40 - OVERLAP
    with pytest.raises(ValueError, match="empty video"):
        buf.start_with(frames)


def test_resampling_by_timestamps():
    assert resample([i / 30 for i in range(10)], 30) == ([*range(10)], False)
    assert resample([i / 60 for i in range(20)], 30)[0] == [*range(0, 20, 2)]
    assert resample([round(i / 30, 3) for i in range(40)], 30) == ([*range(40)], False)   # webm's millisecond times
    index, variable = resample([0, 0.05, 0.07, 0.12, 0.14], 30)     # 50 ms / 20 ms frames
    assert variable and index == [0, 0, 2, 2, 4]     # on screen at 0, 1/30 … 4/30 s (± 1/120 s)


# ---- bad inputs (refused before any model loads; the message names the field and the file) -----------------
def _refusal(tmp_path, video, **kw) -> InputError:
    with pytest.raises(InputError) as e:
        prepare(Request(input_video=video, **{**COMMON, **kw}), 64)
    return e.value


def test_bad_inputs_are_refused_naming_the_field_and_file(tmp_path):
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"not a video at all" * 100)
    e = _refusal(tmp_path, junk)
    assert e.field == "video" and "junk.mp4" in str(e) and "not a readable video" in str(e)
    empty = tmp_path / "empty.webm"
    empty.write_bytes(b"")
    assert "empty.webm is empty" in str(_refusal(tmp_path, empty))
    sound = audio_only(tmp_path / "sound.m4a")
    assert "sound.m4a has no video stream (audio only)" in str(_refusal(tmp_path, sound))
    wide = write_video(tmp_path / "wide.mp4", np.zeros((2, 16, 8208, 3), np.uint8))
    assert "wide.mp4 is 8208×16 pixels" in str(_refusal(tmp_path, wide))
    long = write_video(tmp_path / "long.mp4", np.zeros((125, 16, 16, 3), np.uint8), fps=1)
    assert "long.mp4 is 125.0 s long; the limit is 120 s" in str(_refusal(tmp_path, long))
    short = write_video(tmp_path / "short.mp4", moving_frames(min_frames(W) - 1))
    assert f"short.mp4 has {min_frames(W) - 1} frames" in str(_refusal(tmp_path, short))
    assert str(tmp_path) in InputError.cli_text(_refusal(tmp_path, short))       # the terminal: the full path
    missing = _refusal(tmp_path, tmp_path / "nowhere.mov")
    assert "file not found: nowhere.mov" in str(missing)
    assert "not a job folder" in str(_refusal(tmp_path, tmp_path))


def test_requests_an_extension_cannot_be(tmp_path):
    clip = write_video(tmp_path / "clip.mp4", moving_frames(40))
    img = tmp_path / "start.png"
    make_image().save(img)
    assert _refusal(tmp_path, clip, image=img).field == "image"
    e = _refusal(tmp_path, clip, end_image=img, mode="f1")
    assert e.field == "end image" and "only the original mode" in str(e)
    with pytest.raises(InputError, match="image.*missing.*video"):
        Request.from_mapping({"prompt": "x"})


def test_variable_rate_and_rotation_are_handled(tmp_path):
    frames = moving_frames(60, 96, 64)
    times = np.cumsum([0] + [0.05 if i % 2 else 0.02 for i in range(59)])          # 50 fps / 20 fps
    vfr = prepare(Request(input_video=write_video(tmp_path / "vfr.mp4", frames, times=times), **COMMON), 64).source
    assert vfr.video.variable_rate and abs(len(vfr.frames) - times[-1] * 30) <= 1.5     # 30 fps over its length
    assert vfr.record()["variable_rate"] is True
    upright = prepare(Request(input_video=write_video(tmp_path / "up.mp4", frames), **COMMON), 64)
    turned = prepare(Request(input_video=write_video(tmp_path / "rot.mp4", frames, rotation=90), **COMMON), 64)
    assert turned.source.video.rotation == 90 and turned.source.video.source_size == (64, 96)
    assert upright.width > upright.height and turned.height > turned.width      # a portrait bucket
    # the right column of the upright clip is the top row once turned 90° counterclockwise
    up = np.asarray(upright.image, np.float32)
    rt = np.asarray(turned.image, np.float32)
    assert np.abs(rt[0, :, :].mean(0) - up[:, -1, :].mean(0)).max() < \
        np.abs(rt[-1, :, :].mean(0) - up[:, -1, :].mean(0)).max()


# ---- on the tiny preset ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def jobs(tiny_f1, tmp_path_factory):
    """A 2-section F1 job, the same job with 4 sections, and the first extended by 2 sections."""
    root = tmp_path_factory.mktemp("extend")
    image = root / "in.png"
    make_image(128, 96, seed=5).save(image)
    short = run(Request(image=image, seconds=2.4, **COMMON), tiny_f1, root / "short")
    before = (short.job_dir / "job.json").read_bytes()
    longer = run(Request(image=image, seconds=4.8, **COMMON), tiny_f1, root / "long")
    extended = run(Request(input_video=short.job_dir, seconds=2.4, **COMMON), tiny_f1, root / "ext")
    return short, longer, extended, before


def test_history_from_a_job_folder_is_the_history_it_had(jobs):
    short, longer, _, _ = jobs
    source, image = load_source(Request(input_video=short.job_dir, **COMMON), 64)
    assert source.kind == "job" and source.sections_done == 2
    history_4 = load_checkpoint(longer.job_dir)[0]["history"]
    # the longer job's history after its 2nd section: everything but its last two windows
    torch.testing.assert_close(source.history, history_4[:, :, : -2 * W], atol=0, rtol=0)
    assert image.size == (64, 48)


def test_extending_a_job_equals_the_longer_job(jobs):
    short, longer, extended, before = jobs
    a, b = load_checkpoint(extended.job_dir), load_checkpoint(longer.job_dir)
    for key in ("history", "real", "start_latent", "rng_state"):
        torch.testing.assert_close(a[0][key], b[0][key], atol=0, rtol=0)
    info, info_long = (json.loads((j.job_dir / "job.json").read_text()) for j in (extended, longer))
    assert [s["section"] for s in info["sections"]] == [3, 4]
    assert [s["frames_sha256"] for s in info["sections"]] == [s["frames_sha256"] for s in info_long["sections"][2:]]
    assert (extended.job_dir / "final.mp4").read_bytes() == (longer.job_dir / "final.mp4").read_bytes()
    assert extended.frames == longer.frames == sec.SectionPlan("f1", W, 4).total_frames == 145
    assert info["source"] == {"kind": "job", "path": str(short.job_dir), "sha256": file_sha256(short.video),
                              "sections_as_context": 2, "seed": 7, "preset": "tiny"}
    assert (short.job_dir / "job.json").read_bytes() == before            # the input job is left as it was


def test_a_job_is_extended_with_its_own_window_only(jobs):
    short = jobs[0]
    with pytest.raises(InputError, match="latent window 9"):
        prepare(Request(input_video=short.job_dir, **{**COMMON, "latent_window": 5}), 64)


def test_extending_a_video_file_keeps_its_frames(jobs, tiny_f1, tmp_path):
    clip = write_video(tmp_path / "clip.mov", moving_frames(50), codec="libx264")
    prepared = prepare(Request(input_video=clip, seconds=1.2, crf=10, **COMMON), 64)
    frames_in = prepared.source.frames
    assert frames_in.shape == (50, 48, 64, 3)             # 100×70 -> the 64-preset bucket, 30 fps kept
    assert np.array_equal(np.asarray(prepared.image), frames_in[-1])      # the start image: the last frame
    done = run(prepared.request, tiny_f1, tmp_path / "out")
    assert done.frames == 50 + 4 * W                      # the input, then one section of 4·w new frames
    out = read_frames(done.video)
    assert out.shape[0] == done.frames
    kept = len(frames_in) - OVERLAP
    alone = tmp_path / "alone.mp4"
    alone.write_bytes(encode_segment(frames_in[:kept], crf=10))
    assert np.array_equal(out[:kept], read_frames(alone))   # the input's frames, untouched (decoded alike)
    info = json.loads((done.job_dir / "job.json").read_text())
    src = info["source"]
    assert src["kind"] == "video" and src["path"] == str(clip) and src["sha256"] == file_sha256(clip)
    assert src["frames"] == 50 and src["encoded_frames"] == 4 * W + 1 and src["sections_as_context"] == 1
    assert "input_video" not in info["settings"] and info["status"] == "done"


def test_a_video_too_short_for_full_context_uses_what_it_has(tmp_path):
    long_enough = prepare(Request(input_video=write_video(tmp_path / "a.mp4", moving_frames(90)), **COMMON), 64)
    assert long_enough.source.sections_done == 2 and long_enough.source.tail_frames == 4 * 2 * W + 1


def test_cli_extends_a_video_and_names_the_option_on_bad_input(tmp_path):
    clip = write_video(tmp_path / "clip.webm", moving_frames(40), codec="libvpx-vp9")
    out = tmp_path / "outputs"
    r = cli("generate", "--preset", "tiny", "--extend", clip, "--mode", "f1", "--prompt", "waves", "--seconds", 1.2,
            "--steps", 2, "--seed", 3, "--out", out)
    assert r.returncode == 0, r.stderr
    (job,) = job_folders(out)
    info = json.loads((job / "job.json").read_text())
    assert info["source"]["sha256"] == file_sha256(clip)
    assert read_frames(job / "final.mp4").shape[0] == 40 + 4 * W
    # a job folder extended without --preset: its own models, as resume does (issue 33 item 15: it took hunyuan)
    r = cli("generate", "--extend", job, "--mode", "f1", "--prompt", "more", "--seconds", 1.2, "--steps", 1,
            "--out", out)
    assert r.returncode == 0, r.stderr
    (longer,) = [j for j in job_folders(out) if j != job]
    assert json.loads((longer / "job.json").read_text())["models"]["preset"] == "tiny"
    r = cli("generate", "--preset", "tiny", "--video", job, "--prompt", "waves", "--out", out)   # original mode
    assert r.returncode == 2 and "--mode" in r.stderr and "F1 mode only" in r.stderr
    r = cli("generate", "--preset", "tiny", "--prompt", "waves", "--out", out)
    assert r.returncode == 2 and "--image: missing" in r.stderr and "video to extend" in r.stderr


def _job_folder(tmp_path, name: str, **info):
    folder = tmp_path / name
    folder.mkdir()
    record = {"status": "done", "settings": {"mode": "f1", "latent_window": W, "fps": 30}, **info}
    (folder / "job.json").write_text(json.dumps(record))
    return folder


def test_a_job_folder_that_cannot_be_continued_is_refused_saying_what_to_do_instead(tmp_path):
    """A job folder continues from its saved latents only when it is a finished F1 job of the same window and rate
    with its latents and video: each other case is said (naming the field), before any model loads."""
    cases = [
        (_job_folder(tmp_path, "running", status="running"), "video",
         "the job is 'running', not finished", "Resume it first"),
        (_job_folder(tmp_path, "original", settings={"mode": "original", "latent_window": W}), "video",
         "the job was made in 'original' mode; only F1 jobs continue from their latents", "final.mp4 as a video"),
        (_job_folder(tmp_path, "fps24", settings={"mode": "f1", "latent_window": W, "fps": 24}), "fps",
         "is at 24 fps; extend it at the same rate", ""),
        (_job_folder(tmp_path, "bare"), "video", "the job has no saved latents or no video",
         "Extend its video file instead"),
    ]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "job.json").write_text("{not json")
    cases.append((broken, "video", "job.json cannot be read (", ""))
    for folder, field, words, advice in cases:
        e = _refusal(tmp_path, folder)
        assert (e.field, folder.name) == (field, folder.name) and words in e.message, (folder.name, e.message)
        assert advice in str(e)
    e = _refusal(tmp_path, _job_folder(tmp_path, "f1job"), mode="original")       # the original mode: a video only
    assert e.field == "mode" and "continues from its saved latents in F1 mode only" in e.message


def test_a_video_turned_by_an_odd_angle_or_too_large_or_none_is_refused(tmp_path, monkeypatch):
    from pipeline import video_input
    from pipeline.video_input import load_video

    tilted = write_video(tmp_path / "tilted.mp4", moving_frames(40), rotation=45)
    e = _refusal(tmp_path, tilted)
    assert e.field == "video" and "tilted.mp4 is rotated by 45°" in str(e) and "video editor" in str(e)
    with pytest.raises(InputError, match="no video given"):
        load_video(None, 64)
    clip = write_video(tmp_path / "clip.mp4", moving_frames(40))
    monkeypatch.setattr(video_input, "VIDEO_BYTES_MAX", 1 << 10)
    assert "clip.mp4 is 0 MB; the limit is 0 MB" in str(_refusal(tmp_path, clip))

"""Video files: deterministic bytes (and why they were not), segments joined into one valid stream, the background
writer (work per section that does not grow, errors that reach the job, a lower priority)."""
from __future__ import annotations

import hashlib
import io
import os
import re
import subprocess
import sys
import threading
from dataclasses import replace

import numpy as np
import pytest
import torch

from configs.video import ENCODING
from pipeline import sections as sec
from tests.conftest import ROOT
from tests.video_helpers import smooth_moving_frames
from video.buffer import VideoBuffer
from video.mp4 import encode_segment, read_frames, write_segments
from video.section_writer import SectionWriter, segment_groups


def in_thread_with_cpus(cpus: set[int], fn):
    """Run fn() in a new thread restricted to `cpus` (sched_setaffinity(0) affects only the calling thread)."""
    out = {}

    def run():
        os.sched_setaffinity(0, cpus)
        out["value"] = fn()

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["value"]


def pyav_default_encode(frames: np.ndarray) -> bytes:
    """How this project used to open libx264 (no thread settings): PyAV's slice threading, x264's automatic count."""
    import av

    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        s.options = {"crf": "16", "preset": "medium"}
        for f in frames:
            for p in s.encode(av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to show a CPU-count dependence")
def test_the_cause_pyav_defaults_follow_the_cpus_of_the_calling_thread():
    """The real cause of the bytes that differed between runs: with no thread settings, PyAV opens libx264 with
    slice threading and x264 takes one slice per CPU the calling thread may use, so the same frames gave
    different files under a different CPU set."""
    frames = smooth_moving_frames(12, 256, 320)      # x264 keeps one thread for frames under ~8 macroblock rows
    one = in_thread_with_cpus({min(os.sched_getaffinity(0))}, lambda: pyav_default_encode(frames))
    two = in_thread_with_cpus(set(sorted(os.sched_getaffinity(0))[:2]), lambda: pyav_default_encode(frames))
    assert b"sliced_threads=1" in two and b"threads=1 " in one and b"threads=2 " in two and one != two


def test_our_segments_do_not_depend_on_cpus_or_runs():
    frames = smooth_moving_frames(12, 256, 320)
    cpus = os.sched_getaffinity(0)
    runs = [in_thread_with_cpus({min(cpus)}, lambda: encode_segment(frames)),
            in_thread_with_cpus(cpus, lambda: encode_segment(frames)),
            encode_segment(frames)]
    assert runs[0] == runs[1] == runs[2]
    assert b"sliced_threads=0" in runs[0] and f"threads={ENCODING.x264_threads} ".encode() in runs[0]


ENCODE_IN_CHILD = """
import hashlib, sys
from dataclasses import replace
from configs.video import ENCODING
from video.mp4 import encode_segment
from tests.video_helpers import smooth_moving_frames
encoding = replace(ENCODING, x264_params=sys.argv[1])
for n, h, w in ((33, 64, 64), (24, 128, 160)):
    print(hashlib.sha256(encode_segment(smooth_moving_frames(n, h, w), encoding=encoding)).hexdigest())
"""


def encoded_in_child(malloc_perturb: int, x264_params: str = ENCODING.x264_params) -> str:
    """Hashes of two segments encoded in a fresh process whose freed and new heap memory glibc fills with a byte
    pattern (MALLOC_PERTURB_): what memory held before must not reach the bytes."""
    env = dict(os.environ, MALLOC_PERTURB_=str(malloc_perturb),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    r = subprocess.run([sys.executable, "-c", ENCODE_IN_CHILD, x264_params], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_our_segments_do_not_depend_on_what_the_heap_held():
    """The cause of the videos that differed between runs on AVX-512 CPUs (under load most of all): libx264's
    AVX-512 macroblock-tree routine reads memory it never wrote. The same frames in fresh processes whose heap
    holds different leftovers give the same bytes (x264's `cpu-independent`: that step in its C code)."""
    assert encoded_in_child(165) == encoded_in_child(77)


def test_our_segments_are_the_bytes_of_x264s_portable_code():
    """The same bytes as x264 without any assembly (`asm=0`): no instruction set the CPU offers changes them."""
    frames = smooth_moving_frames(24, 128, 160)
    portable = replace(ENCODING, x264_params=ENCODING.x264_params + ":asm=0")
    assert encode_segment(frames) == encode_segment(frames, encoding=portable)


def test_segment_groups_keep_every_segment_at_two_frames_or_more():
    assert segment_groups([33]) == [[0]]
    assert segment_groups([33, 36, 4]) == [[0], [1], [2]]
    assert segment_groups([1, 4, 4]) == [[0, 1], [2]]            # a one-frame edge joins the next part
    assert segment_groups([4, 4, 1]) == [[0], [1, 2]]            # or the one before it, when it is last
    assert segment_groups([1]) == [[0]]
    assert segment_groups([1, 1, 1, 5]) == [[0, 1], [2, 3]]


def test_joined_segments_are_one_stream_that_decodes_like_its_parts(tmp_path):
    import av

    frames = smooth_moving_frames(45)
    cuts = [(0, 4), (4, 40), (40, 45)]
    segments = [encode_segment(frames[a:b]) for a, b in cuts]
    path = write_segments(segments, tmp_path / "joined.mp4", metadata={"title": "joined"})
    decoded = read_frames(path)
    assert decoded.shape == frames.shape
    parts = []
    for i, s in enumerate(segments):
        parts.append(read_frames(write_segments([s], tmp_path / f"part{i}.mp4")))
    np.testing.assert_array_equal(decoded, np.concatenate(parts))  # joining re-encodes nothing
    whole = read_frames(write_segments([encode_segment(frames)], tmp_path / "whole.mp4"))

    def error(video):
        return np.abs(video.astype(np.int16) - frames).mean()

    assert error(decoded) < 1.05 * error(whole) + 0.05 and error(whole) < 6      # as good as one encode (4:2:0)
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        packets = [p for p in c.demux(stream) if p.size]
        assert float(stream.average_rate) == 30 and c.metadata["title"] == "joined"
        assert [i for i, p in enumerate(packets) if p.is_keyframe] == [0, 4, 40]     # each segment starts clean
        dts = [p.dts for p in packets]
        assert dts == sorted(dts) and len(set(dts)) == len(dts)
    assert not list(tmp_path.glob(".*"))


def _parts(mode: str, window: int, sections: int, size=(48, 64), seed=0):
    plan = sec.SectionPlan(mode, window, sections)
    gen = torch.Generator().manual_seed(seed)
    for s in plan.sections:
        t = sec.pixel_frames(plan.decode_frames(s))
        yield plan, s, (torch.rand((1, 3, t, *size), generator=gen) * 2 - 1).to(torch.float16)


@pytest.mark.parametrize("mode", ["original", "f1"])
def test_writer_files_are_the_video_so_far_and_work_per_section_does_not_grow(mode, tmp_path):
    writer = SectionWriter(mode, sec.overlap_frames(3), fps=30, crf=16)
    reference = VideoBuffer(mode, sec.overlap_frames(3))
    encoded = []
    try:
        for plan, s, pixels in _parts(mode, 3, 5):
            before = writer.segments_encoded
            writer.submit(pixels, s.index + 1, tmp_path / f"section_{s.index + 1}.mp4")
            reference.add(pixels)
            (written,) = list(writer.finish())
            encoded.append(writer.segments_encoded - before)
            frames = reference.frames()
            assert written.section == s.index + 1 and written.frames == len(frames) == plan.video_frames_after(s)
            assert written.frames_sha256 == hashlib.sha256(frames.tobytes()).hexdigest()
            assert read_frames(written.path).shape == frames.shape
    finally:
        writer.close()
    assert max(encoded) <= 2                      # the edge and the newly settled chunk, never the whole video


def test_writer_bytes_do_not_depend_on_how_many_segments_run_at_once(tmp_path):
    files = []
    for parallel in (1, 3):
        writer = SectionWriter("original", sec.overlap_frames(3), fps=30, crf=16,
                               encoding=replace(ENCODING, parallel_segments=parallel))
        try:
            for plan, s, pixels in _parts("original", 3, 4):
                writer.submit(pixels)                              # blend only (as a resumed job rebuilds)
            writer.submit(next(_parts("original", 3, 5, seed=1))[2], 99, tmp_path / f"p{parallel}.mp4")
            (written,) = list(writer.finish())
        finally:
            writer.close()
        files.append(written.path.read_bytes())
    assert files[0] == files[1]


def test_a_writer_failure_reaches_the_job_after_the_files_written_before_it(tmp_path):
    writer = SectionWriter("original", sec.overlap_frames(3), fps=30, crf=16)
    try:
        parts = list(_parts("original", 3, 3))
        writer.submit(parts[0][2], 1, tmp_path / "section_1.mp4")
        writer.submit(parts[1][2], 2, tmp_path / "missing" / "section_2.mp4")
        writer.submit(parts[2][2], 3, tmp_path / "section_3.mp4")
        results = writer.finish()
        assert next(results).section == 1
        with pytest.raises(FileNotFoundError):
            next(results)
        assert list(writer.finish()) == [] and not (tmp_path / "section_3.mp4").exists()   # later work skipped
    finally:
        writer.close()


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread priorities are a Linux feature here")
def test_the_writer_threads_run_at_a_lower_priority(tmp_path):
    writer = SectionWriter("original", sec.overlap_frames(3), fps=30, crf=16)
    try:
        plan, s, pixels = next(_parts("original", 3, 1))
        writer.submit(pixels, 1, tmp_path / "s.mp4")
        list(writer.finish())
        threads = {t.name: t.native_id for t in threading.enumerate()}
        main = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id)
        assert os.getpriority(os.PRIO_PROCESS, threads["video-writer"]) == min(19, main + ENCODING.writer_nice)
        pool = [tid for name, tid in threads.items() if name.startswith("video-segment")]
        assert pool and all(os.getpriority(os.PRIO_PROCESS, tid) > main for tid in pool)
    finally:
        writer.close()


def test_a_job_samples_the_next_section_while_the_last_one_is_written(tiny_original, tmp_path, monkeypatch):
    """With a slow encoder, section 2 samples before section 1's file is done; the job still ends with every file
    written, waits only at its end, and records the wait and the background time."""
    import time as _time

    import video.section_writer as vw
    from pipeline.events import Done, Progress, SectionVideo
    from pipeline.request import Request
    from tests.conftest import make_image, run_job

    real = vw.encode_segment

    def slow_encode(*args, **kwargs):
        _time.sleep(1.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(vw, "encode_segment", slow_encode)
    request = Request(image=make_image(96, 80, seed=3), prompt="a kite", seconds=2.4, steps=2, seed=5,
                      teacache=0.0, resolution=64)
    events, last = run_job(request, tiny_original, tmp_path)
    assert isinstance(last, Done) and not last.stopped
    order = [("video", e.section) if isinstance(e, SectionVideo) else ("step", e.section, e.step)
             for e in events if isinstance(e, SectionVideo) or (isinstance(e, Progress) and e.stage == "sampling"
                                                               and e.step)]
    assert order.index(("step", 2, 1)) < order.index(("video", 1))        # not on the critical path
    assert [o for o in order if o[0] == "video"] == [("video", 1), ("video", 2)]
    assert last.timings["video writing"] > 0 and last.timings["video writing, background"] >= 3.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.bfloat16])
def test_frames_are_the_quantisation_formula_and_the_pixels_stay_as_they_were(dtype):
    from video.mp4 import pixels_to_frames

    g = torch.Generator().manual_seed(3)
    pixels = (torch.randn(1, 3, 5, 7, 9, generator=g) * 0.8).to(dtype)
    pixels[0, 0, 0, 0, :5] = torch.tensor([-1.5, 1.2, 0.99999, -0.999, 0.5]).to(dtype)     # clamped and edges
    before = pixels.clone()
    frames = pixels_to_frames(pixels)
    # the formula the video has always had: ((clamp(x) + 1) · 127.5 + 0.5) truncated, float32 steps
    expected = ((pixels[0].float().clamp(-1, 1) + 1.0) * 127.5 + 0.5).to(torch.uint8).permute(1, 2, 3, 0).numpy()
    assert frames.shape == (5, 7, 9, 3) and frames.dtype == np.uint8 and frames.flags["C_CONTIGUOUS"]
    assert np.array_equal(frames, expected) and torch.equal(pixels, before)


def test_the_writer_is_niced_only_where_a_gpu_is_fed():
    """On a CPU run nothing drives a GPU: a niced writer only starved behind other busy processes (its files waited
    2-3x longer than a section took with one core busy, and the page's ETA undercounted). The bytes do not depend
    on it."""
    from configs.video import ENCODING

    assert ENCODING.for_device("cuda").writer_nice == ENCODING.writer_nice > 0
    assert ENCODING.for_device("cpu").writer_nice == 0
    assert ENCODING.for_device("cpu").x264_params == ENCODING.x264_params


def test_the_writer_refuses_what_would_make_a_broken_file(tmp_path):
    from video.mp4 import decoded_frames, encode_segment, read_metadata, write_segments

    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 32, 48, 3), dtype=np.uint8)
    for bad, words in (({"frames": frames, "crf": 99}, "crf: 99 is outside"),
                       ({"frames": frames.astype(np.float32)}, "frames must be T×H×W×3 uint8"),
                       ({"frames": frames[:0]}, "frames must be T×H×W×3 uint8 (T ≥ 1)")):
        with pytest.raises(ValueError, match=re.escape(words)):
            encode_segment(bad.pop("frames"), **bad)
    with pytest.raises(ValueError, match="no segments to write"):
        write_segments([], tmp_path / "none.mp4")
    one, other_size = encode_segment(frames), encode_segment(frames[:, :16])
    with pytest.raises(ValueError, match="different stream headers"):
        write_segments([one, other_size], tmp_path / "mixed.mp4")
    with pytest.raises(ValueError, match="is not on the time base"):
        write_segments([one, one], tmp_path / "rate.mp4", fps=7)         # 3 frames at 7 fps: no whole tick
    assert not any(tmp_path.glob("*.mp4*"))                              # nothing half-written is left
    path = write_segments([one, one], tmp_path / "ok.mp4", metadata={"title": "t", "comment": {"seed": 1}})
    assert decoded_frames(path) == 6 and read_metadata(path)["comment"] == '{"seed": 1}'      # a value not text: JSON


def test_the_cross_fade_and_the_loop_seam_refuse_clips_they_cannot_join():
    import torch

    from video.blend import soft_append
    from video.loop import seam_blend

    a, b = torch.zeros(1, 3, 4, 2, 2), torch.ones(1, 3, 2, 2, 2)
    assert torch.equal(soft_append(a, b, 0), torch.cat([a, b], dim=2))          # no overlap: joined as they are
    with pytest.raises(ValueError, match="cannot cross-fade 3 frames between clips of 4 and 2 frames"):
        soft_append(a, b, 3)
    with pytest.raises(ValueError, match="need T×H×W×3 uint8 frames"):
        seam_blend(np.zeros((4, 2, 2, 3), np.float32))
    one = np.full((1, 2, 2, 3), 9, np.uint8)
    assert np.array_equal(seam_blend(one), one)                                   # one frame: nothing to blend

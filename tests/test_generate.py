"""End to end on the tiny preset: events, outputs, job.json, playable videos, stop, failure, reproducibility."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from jobfolder.checkpoint import load_checkpoint
from pipeline.cancel import CancelToken
from pipeline.events import Done, Failed, LogLine, Preview, Progress, SectionVideo
from pipeline.orchestrator import generate
from pipeline.request import Request, prepare
from pipeline.sections import make_plan
from tests.conftest import make_image, run_job
from video.mp4 import read_frames, read_metadata, write_mp4

FAST = dict(steps=3, teacache=0.0, resolution=64)


def _request(**kw):
    base = dict(image=make_image(96, 80), prompt="a small boat drifts", seconds=2.4, seed=7, **FAST)
    base.update(kw)
    return Request(**base)


def test_two_sections_events_outputs_and_job_json(tiny_original, tmp_path):
    req = _request()
    events, last = run_job(req, tiny_original, tmp_path)
    assert isinstance(last, Done) and not last.stopped
    plan = make_plan("original", req.seconds, req.latent_window)
    assert plan.count == 2

    previews = [e for e in events if isinstance(e, Preview)]
    assert len(previews) == plan.count * req.steps
    assert previews[0].image.dtype == np.uint8 and previews[0].image.shape[2] == 3
    assert not np.array_equal(previews[0].image, previews[-1].image)
    steps = [(e.section, e.step) for e in events if isinstance(e, Progress) and e.stage == "sampling" and e.step]
    assert steps == [(s, j) for s in (1, 2) for j in (1, 2, 3)]
    assert any(isinstance(e, LogLine) and "[before VAE decode]" in e.message for e in events)

    videos = [e for e in events if isinstance(e, SectionVideo)]
    assert [v.frames for v in videos] == plan.frame_counts() == [33, 73]
    # each section's video reaches the page before the next section's decode starts (it lagged 1-2 sections)
    order = [(type(e).__name__, e.section) for e in events if isinstance(e, SectionVideo)
             or isinstance(e, Progress) and e.stage == "VAE decode"]
    assert order.index(("SectionVideo", 1)) < order.index(("Progress", 2)), order
    assert len({v.path for v in videos}) == 2                      # a new file per section
    for v in videos:
        frames = read_frames(v.path)                              # playable: decodes back with PyAV
        assert frames.shape == (v.frames, 48, 64, 3)               # 96×80 -> nearest 64-bucket, 48×64
    final = read_frames(last.video)
    assert final.shape[0] == 73 and last.frames == 73
    assert final.std() > 1                                        # not a blank video

    import av
    with av.open(str(last.video)) as c:
        stream = c.streams.video[0]
        assert stream.codec_context.name == "h264" and stream.codec_context.pix_fmt == "yuv420p"
        assert float(stream.average_rate) == 30
    meta = read_metadata(last.video)
    assert "a small boat drifts" in json.dumps(meta) and "seed: 7" in json.dumps(meta)

    info = json.loads((last.job_dir / "job.json").read_text())
    assert info["status"] == "done" and info["final"] == "final.mp4"
    assert info["settings"]["seed"] == 7 and info["settings"]["prompt"] == "a small boat drifts"
    assert info["models"]["preset"] == "tiny" and "transformer" in info["models"]["revisions"]
    assert info["versions"]["torch"] and info["versions"]["diffusers"] == "0.42.1"
    for stage in ("text encoders", "VAE encode", "image encoder", "transformer", "VAE decode", "total"):
        assert info["timings"][stage] > 0
    assert [s["name"] for s in info["memory"]["stages"]][:4] == ["text encoders", "VAE encode", "image encoder",
                                                                 "transformer"]
    assert "peak_reserved" in info["memory"]
    assert (last.job_dir / "input.png").exists()
    assert not list(last.job_dir.glob(".*"))                      # no temp files left behind


def test_same_seed_same_video_other_seed_differs(tiny_f1, tmp_path):
    latents = []
    for seed in (3, 3, 4):
        _, last = run_job(_request(seed=seed, mode="f1", seconds=1.2), tiny_f1, tmp_path)
        latents.append(load_checkpoint(last.job_dir)[0]["real"])
    assert torch.equal(latents[0], latents[1])
    assert not torch.allclose(latents[0], latents[2])


@pytest.mark.parametrize("sampler", ["unipc", "euler"])
def test_samplers_give_finite_latents(tiny_original, tmp_path, sampler):
    _, last = run_job(_request(sampler=sampler, seconds=1.2, steps=4), tiny_original, tmp_path)
    real = load_checkpoint(last.job_dir)[0]["real"]
    assert torch.isfinite(real).all() and real.abs().mean() > 0.1


def _count_block_calls(transformer):
    calls = []
    hook = transformer.transformer_blocks[0].register_forward_pre_hook(lambda *a: calls.append(1))
    return calls, hook


def test_teacache_skips_steps_and_cfg_runs_negative_branch(tiny_original, tmp_path):
    tr = tiny_original.transformer
    counts = {}
    for name, kw in {"plain": dict(teacache=0.0), "teacache": dict(teacache=0.5),
                     "cfg": dict(teacache=0.0, cfg=3.0, negative_prompt="blurry")}.items():
        calls, hook = _count_block_calls(tr)
        try:
            _, last = run_job(_request(seconds=1.2, steps=8, **kw), tiny_original, tmp_path)
        finally:
            hook.remove()
        assert isinstance(last, Done)
        counts[name] = len(calls)
    assert counts["plain"] == 8
    assert 2 <= counts["teacache"] < 8                            # first and last always computed
    assert counts["cfg"] == 16                                   # positive + negative per step


def test_stop_keeps_the_video_made_so_far(tiny_original, tmp_path):
    cancel = CancelToken()
    events = []
    for ev in generate(prepare(_request(seconds=3.6), 64), tiny_original, cancel=cancel, outputs=tmp_path):
        events.append(ev)
        if isinstance(ev, Progress) and ev.section == 2 and ev.step == 1:
            cancel.cancel()
    last = events[-1]
    assert isinstance(last, Done) and last.stopped
    assert sum(isinstance(e, SectionVideo) for e in events) == 1
    assert read_frames(last.video).shape[0] == 33 == last.frames
    info = json.loads((last.job_dir / "job.json").read_text())
    assert info["status"] == "stopped" and info["final"] == "final.mp4"


def test_stop_before_any_section_ends_cleanly(tiny_original, tmp_path):
    cancel = CancelToken()
    cancel.cancel()
    _, last = run_job(_request(), tiny_original, tmp_path, cancel=cancel)
    assert isinstance(last, Done) and last.stopped and last.video is None and last.frames == 0
    assert json.loads((last.job_dir / "job.json").read_text())["status"] == "stopped"


def test_failure_marks_job_failed_and_keeps_finished_sections(tiny_original, tmp_path, monkeypatch):
    from memory.manager import MemoryManager

    memory = MemoryManager(device="cpu")
    real_decode = memory.decode_vae
    calls = []

    def flaky_decode(vae, z):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated decoder crash")
        return real_decode(vae, z)

    monkeypatch.setattr(memory, "decode_vae", flaky_decode)
    events, last = run_job(_request(), tiny_original, tmp_path, memory=memory)
    assert isinstance(last, Failed) and "simulated decoder crash" in last.message
    assert "Traceback" in last.detail
    info = json.loads((last.job_dir / "job.json").read_text())
    assert info["status"] == "failed" and info["final"] is None and "simulated" in info["error"]
    assert not (last.job_dir / "final.mp4").exists()
    assert last.partial_video is not None and read_frames(last.partial_video).shape[0] == 33
    assert sorted(p.name for p in last.job_dir.glob("*.mp4")) == ["section_01.mp4"]
    assert not list(last.job_dir.glob(".*"))


def test_mode_mismatch_is_reported(tiny_original, tmp_path):
    _, last = run_job(_request(mode="f1"), tiny_original, tmp_path)
    assert isinstance(last, Failed) and last.message.startswith("mode:")


def test_write_mp4_validates_and_is_atomic(tmp_path):
    frames = np.zeros((5, 32, 32, 3), dtype=np.uint8)
    with pytest.raises(ValueError, match="crf"):
        write_mp4(frames, tmp_path / "x.mp4", crf=60)
    with pytest.raises(ValueError):
        write_mp4(np.zeros((5, 32, 32), dtype=np.uint8), tmp_path / "y.mp4")
    assert list(tmp_path.iterdir()) == []
    path = write_mp4(frames + 100, tmp_path / "ok.mp4", crf=0)
    assert read_frames(path).shape == (5, 32, 32, 3)

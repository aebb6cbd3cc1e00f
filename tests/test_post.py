"""Post-processing (post/): each step's frames, size and fps; RIFE ×2 keeps the original frames bit for bit; model
files refused by architecture before anything runs; a post job through the one queue, stopped and resumed to the
same bytes; a missing model file refused by the one pre-flight."""
from __future__ import annotations

import pickle
import zipfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from common.errors import InputError
from configs.runtime import Config
from post import esrgan, rife
from post.job import PostFolders, prepare, prepare_resume, run_post
from post.modelfiles import ModelRef, check_file
from post.process import interpolate, upscale
from post.steps import chunks, make_plan, parse_step, request_from
from tests.post_helpers import pattern_video, video_shape
from tests.video_helpers import audio_only
from ui.sessions import Sessions

pytestmark = pytest.mark.usefixtures("one_torch_thread")      # conftest: the tiny networks on one thread



@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return pattern_video(tmp_path_factory.mktemp("post") / "src.mp4")


def _folders(tmp_path: Path, tiny=True) -> PostFolders:
    return PostFolders(tmp_path / "upscalers", tmp_path / "interpolators", tiny=tiny)


@pytest.mark.parametrize("steps, frames, fps, size", [
    ("trim=0.1:0.3", 6, 30, (64, 48)),                      # 3..8
    ("speed=2", 6, 30, (64, 48)),
    ("speed=0.5", 24, 30, (64, 48)),
    ("reverse", 12, 30, (64, 48)),
    ("pingpong", 22, 30, (64, 48)),
    ("loop=3", 36, 30, (64, 48)),
    ("interpolate=2", 23, 60, (64, 48)),
    ("interpolate=4", 45, 120, (64, 48)),
    ("interpolate=fps:45", 17, 45, (64, 48)),
    ("upscale=2", 12, 30, (128, 96)),
    ("upscale=4", 12, 30, (256, 192)),
    ("loop=2 interpolate=2 upscale=2", 47, 60, (128, 96)),
])
def test_each_step_makes_its_frame_count_size_and_fps(steps, frames, fps, size):
    plan = make_plan(request_from({"source": "x.mp4", "steps": steps}), [12], Fraction(30), 64, 48)
    assert (plan.out_frames, plan.out_fps, (plan.out_width, plan.out_height)) == (frames, fps, size)
    spans = chunks(plan)
    assert spans[0][0] == 0 and spans[-1][1] == frames and all(a < b for a, b in spans)


def test_edits_are_index_maps_in_the_order_given():
    order = make_plan(request_from({"source": "x", "steps": "reverse pingpong"}), [4], Fraction(30), 8, 8).order
    assert [k for _, k in order] == [3, 2, 1, 0, 1, 2]
    joined = make_plan(request_from({"sources": ["a", "b"], "steps": "trim=0:0.1"}), [2, 3], Fraction(30), 8, 8)
    assert joined.order == ((0, 0), (0, 1), (1, 0))


@pytest.mark.parametrize("text, field_words", [("blur=2", "not a step"), ("interpolate=3", "choose 2, 4"),
                                               ("speed=0", "choose from"), ("trim=3:1", "START:END"),
                                               ("loop=x", "not a number"), ("upscale=8", "choose 2 or 4")])
def test_a_bad_step_is_refused_naming_the_field(text, field_words):
    with pytest.raises(InputError) as e:
        parse_step(text)
    assert e.value.field == "steps" and field_words in str(e.value)


def test_x2_interpolation_keeps_every_original_frame_bit_for_bit():
    net = rife.tiny_ifnet()
    rng = np.random.default_rng(3)
    frames = [rng.integers(0, 256, (40, 56, 3), dtype=np.uint8) for _ in range(5)]
    times = [Fraction(k, 2) for k in range(9)]
    out = interpolate(net, frames, times, 0, torch.device("cpu"), torch.float32)
    assert len(out) == 9 and all(f.shape == (40, 56, 3) and f.dtype == np.uint8 for f in out)
    for k in range(5):
        assert np.array_equal(out[2 * k], frames[k])
    assert not any(np.array_equal(out[2 * k + 1], frames[k]) for k in range(4))     # the network made the others


def test_the_full_size_rife_loads_from_its_published_layout(tmp_path):
    """A file with RIFE 4.25's parameter names and shapes (random values) builds the full network; one that is
    not an IFNet is refused."""
    full = rife.IFNet()
    assert [b.conv0[1][0].out_channels for b in full.blocks] == [192, 128, 96, 64, 32]
    path = tmp_path / "flownet.pkl"
    torch.save({"module." + k: v for k, v in full.state_dict().items()}, path)
    ref = ModelRef("interpolator", "flownet.pkl")
    assert len(check_file(ref, tmp_path)) == 64
    save_file({"conv.weight": torch.zeros(3, 3, 3, 3)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(InputError) as e:
        check_file(ModelRef("interpolator", "other.safetensors"), tmp_path)
    assert e.value.field == "interpolation model" and "RIFE" in str(e.value)


def test_upscaling_doubles_the_frames_and_tiles_agree_with_the_whole_frame():
    model, spec = esrgan.tiny_upscaler(2)
    rng = np.random.default_rng(4)
    frames = [rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(3)]
    whole = upscale(model, 2, frames, torch.device("cpu"), torch.float32)
    tiled = upscale(model, 2, frames, torch.device("cpu"), torch.float32, tile=16)
    assert [f.shape for f in whole] == [(80, 96, 3)] * 3
    assert max(int(np.abs(a.astype(int) - b.astype(int)).max()) for a, b in zip(whole, tiled)) <= 1


def test_upscaler_architectures_are_recognised_from_the_file(tmp_path):
    for spec in (esrgan.UpscalerSpec("RRDBNet", 2, 16, 2, 8), esrgan.UpscalerSpec("RRDBNet", 4, 16, 1, 8),
                 esrgan.UpscalerSpec("SRVGGNetCompact", 4, 16, 3)):
        state = esrgan.build(spec).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "m.safetensors"))
        model, found = esrgan.upscaler_from_state({"params_ema": state})
        assert found == spec
        y = model(torch.rand(1, 3, 8, 8))
        assert y.shape == (1, 3, 8 * spec.scale, 8 * spec.scale)
        assert check_file(ModelRef("upscaler", "m.safetensors"), tmp_path)


def test_an_upscaler_of_unknown_architecture_is_refused_and_never_run(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda *a, **k: ran.append(a) or None)
    save_file({"encoder.layers.0.attn.qkv.weight": torch.zeros(8, 8)}, str(tmp_path / "swin.safetensors"))
    with pytest.raises(InputError) as e:
        check_file(ModelRef("upscaler", "swin.safetensors"), tmp_path)
    assert e.value.field == "upscaler" and "not an ESRGAN-family file" in str(e.value)

    class Payload:                      # a pickle that would run code when unpickled unsafely
        def __reduce__(self):
            return (ran.append, ("executed",))

    (tmp_path / "evil.pth").write_bytes(pickle.dumps({"conv_first.weight": Payload()}))
    with pytest.raises(InputError) as e:
        check_file(ModelRef("upscaler", "evil.pth"), tmp_path)
    assert e.value.field == "upscaler" and not ran


def test_a_missing_model_file_is_refused_before_queueing(tmp_path, source):
    folders = _folders(tmp_path, tiny=False)
    with pytest.raises(InputError) as e:
        prepare({"source": str(source), "steps": "upscale=2:mine.pth"}, folders)
    assert e.value.field == "upscaler" and "there is no mine.pth" in str(e.value)
    (tmp_path / "upscalers").mkdir()
    (tmp_path / "upscalers" / "broken.pth").write_bytes(b"not a model")
    with pytest.raises(InputError) as e:
        prepare({"source": str(source), "steps": "upscale=2:broken.pth"}, folders)
    assert "could not be read as a model file" in str(e.value)


def _run(checked, outputs, folders, cancel=None):
    from memory.manager import MemoryManager

    return list(run_post(checked, MemoryManager(device=torch.device("cpu")), cancel=cancel, outputs=outputs,
                         folders=folders))


def test_a_post_job_writes_its_video_and_exports(tmp_path, source):
    from pipeline.events import Done, Preview, Progress, Started

    folders = _folders(tmp_path)
    checked = prepare({"source": str(source), "steps": "interpolate=2 upscale=2", "export": "gif"}, folders)
    events = _run(checked, tmp_path / "out", folders)
    assert isinstance(events[0], Started) and isinstance(events[-1], Done) and not events[-1].stopped
    assert any(isinstance(e, Preview) for e in events) and any(isinstance(e, Progress) for e in events)
    etas = [e.eta_s for e in events if isinstance(e, Progress) and e.stage == "post-processing"]
    assert etas == [0.0]                                              # one chunk: nothing left after it
    job = events[-1].job_dir
    assert video_shape(job / "final.mp4") == (23, 128, 96, 60)
    gif = video_shape(job / "final.gif")
    assert gif[1:3] == (128, 96) and 18 <= gif[0] <= 23           # GIF runs at most 50 frames/s
    from video.mp4 import read_metadata
    meta = read_metadata(job / "final.mp4")
    assert meta["title"] == "a moving test pattern"
    assert meta["comment"] == "prompt: a moving test pattern | seed: 7 | SteadyFrame post: interpolate=2 upscale=2"
    import json
    info = json.loads((job / "job.json").read_text())
    assert info["status"] == "done" and info["settings"]["steps"] == ["interpolate=2", "upscale=2"]
    assert set(info["models"]) == {"interpolator", "upscaler"}


@pytest.mark.parametrize("export, check_out", [
    ("webm", lambda p: video_shape(p)[:3] == (12, 64, 48)),
    ("h265", lambda p: video_shape(p)[:3] == (12, 64, 48)),
    ("zip", lambda p: len(zipfile.ZipFile(p).namelist()) == 12),
    ("frame", lambda p: av.open(str(p)).streams.video[0].codec_context.width == 64),
])
def test_exports(tmp_path, source, export, check_out):
    folders = _folders(tmp_path)
    checked = prepare({"source": str(source), "steps": "reverse", "export": export}, folders)
    job = _run(checked, tmp_path / "out", folders)[-1].job_dir
    out = [p for p in job.iterdir() if p.name.startswith(("final-", "final.w", "frames", "frame."))]
    assert len(out) == 1 and check_out(out[0])


def test_a_stopped_post_job_resumes_to_the_same_bytes(tmp_path, source):
    from pipeline.cancel import CancelToken
    from pipeline.events import Done, Progress

    folders = _folders(tmp_path)
    values = {"source": str(source), "steps": "loop=3 interpolate=2"}
    whole = _run(prepare(values, folders), tmp_path / "a", folders)[-1]
    assert len(chunks(prepare(values, folders).plan)) >= 3

    class StopAfterOne(CancelToken):
        seen = 0

        def check(self):
            StopAfterOne.seen += 1
            if StopAfterOne.seen > 1:
                self.cancel()
            super().check()

    stopped = _run(prepare(values, folders), tmp_path / "b", folders, cancel=StopAfterOne())
    assert isinstance(stopped[-1], Done) and stopped[-1].stopped
    job = stopped[-1].job_dir
    (first,) = [e for e in stopped if isinstance(e, Progress) and e.stage == "post-processing"]
    assert first.eta_s > 0                                            # the chunks left, at the first one's pace
    assert not (job / "final.mp4").exists()
    resumed = _run(prepare_resume(job, folders), tmp_path / "b", folders)
    assert sum(isinstance(e, Progress) and e.stage == "post-processing" for e in resumed) == \
        len(chunks(prepare(values, folders).plan)) - 1
    assert (resumed[-1].job_dir / "final.mp4").read_bytes() == (whole.job_dir / "final.mp4").read_bytes()


def _runner(outputs: Path, preset: str, **config):
    from jobs.local import LocalExecutor
    from jobs.models import ComponentCache
    from jobs.runner import open_runner

    cfg = Config(preset=preset, outputs=outputs, **config)
    return open_runner(cfg, LocalExecutor(cfg, ComponentCache(preset), torch.device("cpu")), device_type="cpu")[0]


def test_the_one_preflight_refuses_a_missing_or_wrong_model_file_at_queue_time(tmp_path, source):
    runner = _runner(tmp_path / "out", "hunyuan", upscaler_dir=tmp_path / "ups", interpolator_dir=tmp_path / "ips")
    try:
        for steps, words in (("upscale=2:none.pth", "there is no none.pth in ups/"),
                             ("interpolate=2:none.pth", "there is no none.pth in ips/")):
            with pytest.raises(InputError) as e:
                runner.submit_many([request_from({"source": str(source), "steps": steps})], origin="cli")
            assert words in str(e.value)
        (tmp_path / "ups").mkdir()
        save_file({"layers.0.weight": torch.zeros(4, 4)}, str(tmp_path / "ups" / "odd.safetensors"))
        with pytest.raises(InputError) as e:
            runner.submit_many([request_from({"source": str(source), "steps": "upscale=2:odd.safetensors"})])
        assert e.value.field == "upscaler" and "not an ESRGAN-family file" in str(e.value)
        assert runner.store.entries() == []                 # nothing was queued
    finally:
        runner.close()


def test_a_post_job_runs_in_the_one_queue_and_is_a_past_job(tmp_path, source):
    import time

    from jobs import store as qs
    from ui.jobs_gallery import read_job

    runner = _runner(tmp_path / "out", "tiny").start()
    try:
        (job,) = runner.submit_many([request_from({"source": str(source), "steps": "interpolate=2",
                                                   "export": "frame"})], origin="cli")
        deadline = time.monotonic() + 120
        while runner.store.get(job.entry).status not in qs.FINISHED and time.monotonic() < deadline:
            time.sleep(0.2)
        entry = runner.store.get(job.entry)
        assert entry.status == qs.DONE, entry.message
        folder = tmp_path / "out" / entry.job_dir
        assert video_shape(folder / "final.mp4")[:1] == (23,) and (folder / "frame.png").is_file()
        record = read_job(folder)
        assert "after the video: interpolate=2 → frame" in record.caption() and not record.resumable
    finally:
        runner.close()


def test_the_command_line_refuses_bad_steps_with_exit_2_and_runs_post_batch_lines(tmp_path, source, capsys):
    import json
    import shutil

    from cli.commands import main

    out = tmp_path / "out"
    assert main(["post", str(source), "--steps", "upscale=3", "--outputs", str(out), "--preset", "tiny"]) == 2
    assert "--steps: upscale=3: choose 2 or 4" in capsys.readouterr().err
    assert main(["post", str(tmp_path / "nothing.mp4"), "--outputs", str(out), "--export", "gif"]) == 2
    assert "source: there is no file" in capsys.readouterr().err
    shutil.copy(source, tmp_path / "clip.mp4")
    lines = tmp_path / "jobs.jsonl"
    lines.write_text(json.dumps({"kind": "post", "source": "clip.mp4", "steps": ["reverse", "loop=2"],
                                 "export": "zip"}) + "\n")
    assert main(["batch", str(lines), "--outputs", str(out), "--preset", "tiny", "-q"]) == 0
    (job,) = [d for d in out.iterdir() if d.is_dir() and not d.name.startswith(".")]
    assert len(zipfile.ZipFile(job / "frames.zip").namelist()) == 24


def test_a_post_job_stopped_in_the_queue_resumes_from_past_jobs_to_the_same_bytes(tmp_path, source):
    """End stops the queue's post job after a chunk; the folder's Resume (the page's, the API's, the command line's:
    Runner.submit_resume) finishes it with the bytes of a run that was not stopped."""
    from pipeline.events import Done, Progress

    values = {"source": str(source), "steps": "loop=6"}              # 72 frames: 5 chunks
    whole = _run(prepare(values, _folders(tmp_path)), tmp_path / "whole", _folders(tmp_path))[-1]
    runner = _runner(tmp_path / "out", "tiny").start()
    try:
        sessions = Sessions(runner)
        job = sessions.submit(request_from(values), session="tab", origin="page")
        stopped = None
        for batch in sessions.stream(job):
            for event in batch:
                if isinstance(event, Progress) and event.stage == "post-processing":
                    sessions.cancel("tab")
                if isinstance(event, Done):
                    stopped = event
        assert stopped is not None and stopped.stopped and not (stopped.job_dir / "final.mp4").exists()
        again = sessions.submit_resume(stopped.job_dir, session="tab", origin="page")
        results = [e for batch in sessions.stream(again) for e in batch]
        assert isinstance(results[-1], Done) and not results[-1].stopped
        assert 0 < sum(isinstance(e, Progress) and e.stage == "post-processing" for e in results) < 5
        assert (stopped.job_dir / "final.mp4").read_bytes() == (whole.job_dir / "final.mp4").read_bytes()
    finally:
        runner.close()


def test_post_lines_pass_the_doors_and_queue_add(tmp_path, source, capsys):
    """A jobs file's post line: its videos go through the door's file rule like any file (the app's doors refuse a
    server path), and `python -m cli queue add` queues it checked by the one pre-flight."""
    import json
    import shutil

    from cli.queue import main as queue_main
    from jobs import store as qs
    from jobs.doors import admitted
    from ui.access import Access
    from ui.doors import client

    line = {"kind": "post", "source": "clip.mp4", "steps": ["interpolate=2"], "export": "gif"}
    with pytest.raises(InputError) as e:
        admitted({**line, "source": str(source)}, client(Access(), None, tmp_path))
    assert e.value.field == "video" and "only a file uploaded to this app" in str(e.value)
    shutil.copy(source, tmp_path / "clip.mp4")
    (tmp_path / "jobs.jsonl").write_text(json.dumps(line) + "\n")
    out = tmp_path / "out"
    assert queue_main(["add", str(tmp_path / "jobs.jsonl"), "--outputs", str(out), "--preset", "tiny"]) == 0
    assert "'interpolate=2'" in capsys.readouterr().out
    (entry,) = qs.QueueStore.open(out)[0].entries()
    assert entry.settings["kind"] == "post" and entry.settings["sources"] == [str(tmp_path / "clip.mp4")]


def _original_esrgan_names(state: dict, blocks: int) -> dict:
    """BasicSR's RRDBNet names as the original ESRGAN repository saved them (`model.0`, `model.1.sub.N.RDBK.convJ.0`,
    `model.1.sub.<blocks>` for the trunk's last convolution, `model.3/6/8/10` for the upsampling tail)."""
    tail = {"conv_up1": "model.3", "conv_up2": "model.6", "conv_hr": "model.8", "conv_last": "model.10"}
    out = {}
    for key, value in state.items():
        head, _, param = key.rpartition(".")
        if key.startswith("body."):
            _, n, rdb, conv, param = key.split(".")
            out[f"model.1.sub.{n}.RDB{rdb[-1]}.{conv}.0.{param}"] = value
        elif head == "conv_first":
            out[f"model.0.{param}"] = value
        elif head == "conv_body":
            out[f"model.1.sub.{blocks}.{param}"] = value
        else:
            out[f"{tail[head]}.{param}"] = value
    return out


def test_an_original_esrgan_file_runs_as_the_same_network_and_misfits_are_refused():
    spec = esrgan.UpscalerSpec("RRDBNet", 4, 8, 2, 4)
    torch.manual_seed(3)
    reference = esrgan.build(spec).eval()
    original = _original_esrgan_names(reference.state_dict(), spec.blocks)
    model, found = esrgan.upscaler_from_state({"state_dict": {f"module.{k}": v for k, v in original.items()}})
    assert found == spec                                  # the old names, wrapped and DataParallel-prefixed
    x = torch.rand(1, 3, 6, 6)
    with torch.no_grad():
        assert torch.equal(model(x), reference(x))        # the same weights in the same places
    refused = {
        "a scale other than 4": {k: v for k, v in original.items() if not k.startswith("model.10.")},
        "with an unknown key 'model.2.weight'": {**original, "model.2.weight": torch.zeros(1)},
        "holds no tensors by name": {"params": {"conv_first.weight": [1, 2]}},
        "an RRDBNet with 5 input channels (known: 3, 12, 48)": {
            **reference.state_dict(), "conv_first.weight": torch.zeros(8, 5, 3, 3)},
        "a compact VGG-style file with an output that is not 3·scale² channels": {
            "body.0.weight": torch.zeros(4, 3, 3, 3), "body.1.weight": torch.zeros(4),
            "body.2.weight": torch.zeros(10, 4, 3, 3)},
        "RRDBNet-like file that does not fit it: missing ['conv_up1.weight'": {
            k: v for k, v in reference.state_dict().items() if not k.startswith("conv_up1.")},
    }
    for words, state in refused.items():
        with pytest.raises(esrgan.UnknownArchitecture) as e:
            esrgan.upscaler_from_state(state)
        assert words in str(e.value), words


@pytest.mark.parametrize("text, words", [
    ("reverse=2", "reverse takes no value"), ("speed", "speed needs a value (e.g. speed=1.5)"),
    ("trim=nan:2", "trim start: 'nan' is not a finite number"), ("loop=99", "loop=99: choose 1 to"),
    ("interpolate=fps:500", "interpolate=fps:500: choose 1 to"), ("faces=3", "faces=3: choose a strength from"),
])
def test_more_bad_steps_say_what_the_step_takes(text, words):
    with pytest.raises(InputError) as e:
        parse_step(text)
    assert e.value.field == "steps" and words in e.value.message


def test_every_step_reads_back_as_the_text_it_came_from():
    for text in ("trim=0.5:3", "speed=1.5", "reverse", "pingpong", "loop=3", "interpolate=2",
                 "interpolate=4:rife.safetensors", "interpolate=fps:60", "upscale=2:x4.pth", "faces=0.7",
                 "faces=1:GFPGANv1.3.pth"):
        assert parse_step(text).text() == text
    assert parse_step("faces").text() == "faces=1"                      # the default strength, said


@pytest.mark.parametrize("values, field, words", [
    ({"steps": "reverse"}, "video", "give the video to work on"),
    ({"source": "a.mp4", "steps": "upscale=2 upscale=4"}, "steps", "upscale is given twice; give it once"),
    ({"source": "a.mp4", "steps": "reverse", "export": "avi"}, "export", "'avi' is not a format; choose one of"),
    ({"source": "a.mp4"}, "steps", "nothing to do: give at least one step, another export format"),
    ({"source": "a.mp4", "steps": "reverse", "frame": "last"}, "frame", "frame and crf must be whole numbers"),
    ({"source": "a.mp4", "steps": "reverse", "crf": 60}, "crf", "60 is outside 0–51"),
])
def test_a_post_request_that_cannot_run_is_refused_naming_the_field(values, field, words):
    with pytest.raises(InputError) as e:
        request_from(values)
    assert e.value.field == field and words in e.value.message


def test_relative_sources_are_relative_to_the_jobs_file_and_too_many_frames_are_refused(tmp_path):
    request = request_from({"sources": ["a.mp4", str(tmp_path / "b.mp4")], "steps": "loop=2"}, base=tmp_path)
    assert request.sources == (tmp_path / "a.mp4", tmp_path / "b.mp4")
    with pytest.raises(InputError, match="leaves no frames"):
        make_plan(request_from({"source": "x", "steps": "trim=5:6"}), [10], Fraction(30), 8, 8)
    with pytest.raises(InputError, match="more than .*; loop less or interpolate less"):
        make_plan(request_from({"source": "x", "steps": "loop=2 interpolate=4"}), [3000], Fraction(30), 8, 8)


def test_an_upscaler_file_of_another_scale_or_changed_since_queued_fails_the_job_with_its_record(tmp_path, source):
    import json

    from pipeline.events import Failed

    folders = _folders(tmp_path, tiny=False)
    folders.upscalers.mkdir()
    model_file = folders.upscalers / "x4.safetensors"

    def save(scale: int, seed: int) -> None:
        torch.manual_seed(seed)
        state = esrgan.build(esrgan.UpscalerSpec("RRDBNet", scale, 8, 1, 4)).state_dict()
        save_file({k: v.contiguous() for k, v in state.items()}, str(model_file))

    save(4, 0)
    checked = prepare({"source": str(source), "steps": "upscale=2:x4.safetensors"}, folders)   # a known file
    assert checked.models["upscaler"]["file"] == "x4.safetensors"
    end = _run(checked, tmp_path / "out", folders)[-1]
    assert isinstance(end, Failed) and "upscales ×4, not ×2; choose upscale=4 or another file" in end.message
    info = json.loads((end.job_dir / "job.json").read_text())
    assert info["status"] == "failed" and "upscales ×4, not ×2" in info["error"]
    save(2, 1)                                               # replaced after the job was checked and queued
    end = _run(checked, tmp_path / "out2", folders)[-1]
    assert isinstance(end, Failed) and "x4.safetensors changed since the job was queued (sha256" in end.message
    assert json.loads((end.job_dir / "job.json").read_text())["status"] == "failed"


def test_the_benchmarks_arithmetic_floor_is_what_the_networks_compute():
    """benchmarks/post_steps.py divides by `flop_per_frame`: it must be the convolutions the network runs (counted
    op by op), for every ESRGAN-family layout and for RIFE at a size the interpolation pads to."""
    from tests.post_helpers import conv_flops

    torch.manual_seed(0)
    for spec in (esrgan.UpscalerSpec("RRDBNet", 4, 8, 1, 4), esrgan.UpscalerSpec("RRDBNet", 2, 8, 2, 4),
                 esrgan.UpscalerSpec("RRDBNet", 1, 8, 1, 4), esrgan.UpscalerSpec("SRVGGNetCompact", 4, 8, 2)):
        model = esrgan.build(spec).eval()
        assert conv_flops(model, torch.rand(1, 3, 16, 24)) == esrgan.flop_per_frame(spec, 16, 24), spec
    net = rife.tiny_ifnet()
    side = rife.ALIGN
    assert conv_flops(net, torch.rand(1, 3, side, 2 * side), torch.rand(1, 3, side, 2 * side), 0.5) == \
        rife.flop_per_frame(net, side, 2 * side)


def test_a_source_that_is_no_usable_video_is_refused_naming_the_file(tmp_path):
    from post.frames import probe

    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00\x00\x00\x18ftypmp42" + b"garbage" * 50)
    sound = audio_only(tmp_path / "sound.m4a")
    for path, words in ((junk, "junk.mp4 could not be read as a video"), (sound, "sound.m4a has no video stream")):
        with pytest.raises(InputError) as e:
            probe(path)
        assert e.value.field == "video" and words in str(e.value)
    with pytest.raises(InputError, match="junk.mp4 could not be read as a video"):
        prepare({"source": str(junk), "steps": "reverse"}, _folders(tmp_path))     # the pre-flight says it too


def test_a_finished_post_job_is_done_and_not_resumed_and_a_crash_keeps_its_record(tmp_path, source, monkeypatch):
    import json

    from pipeline.events import Failed
    from post import process
    from post.job import is_done, is_post_folder

    folders = _folders(tmp_path)
    job = _run(prepare({"source": str(source), "steps": "reverse"}, folders), tmp_path / "out", folders)[-1].job_dir
    assert is_post_folder(job) and is_done(job)
    assert not is_post_folder(tmp_path) and not is_done(tmp_path)                # no record: not a post job
    with pytest.raises(InputError, match=f"job {job.name} is already complete"):
        prepare_resume(job, folders)

    def broken(*args, **kwargs):
        raise RuntimeError("the upscaler broke")

    monkeypatch.setattr(process, "upscale", broken)
    end = _run(prepare({"source": str(source), "steps": "upscale=2"}, folders), tmp_path / "out2", folders)[-1]
    assert isinstance(end, Failed) and end.message == "RuntimeError: the upscaler broke" and end.detail
    info = json.loads((end.job_dir / "job.json").read_text())
    assert info["status"] == "failed" and info["error"] == "RuntimeError: the upscaler broke"

"""Validation once: the UI/API/CLI check a request (and decode its images) before any model loads, and hand the
orchestrator a PreparedRequest, which never checks or decodes again; a resume likewise."""
from __future__ import annotations

import pytest
import torch

import pipeline.request
from pipeline.cancel import CancelToken
from cli.commands import Runner, build_parser, request_from_args
from pipeline.events import Done, Progress
from pipeline.orchestrator import generate
from pipeline.request import Request, prepare
from tests.conftest import make_image
from jobs.models import ComponentCache
from ui.runner import JobRunner


@pytest.fixture
def decodes(monkeypatch):
    """Every image decode (pipeline.request's load_image), as (field, source) pairs."""
    seen = []
    real = pipeline.request.load_image

    def counting(source, field, *args, **kwargs):
        seen.append((field, str(source)[:80]))
        return real(source, field, *args, **kwargs)

    monkeypatch.setattr(pipeline.request, "load_image", counting)
    return seen


def _cli_runner(tiny_original, *argv):
    """The CLI's runner for `argv` (the tiny preset: its models are built in code, no image involved)."""
    args = build_parser().parse_args([*argv, "--device", "cpu"])
    return Runner(args), args


def test_the_cli_decodes_the_image_once_per_job(tiny_original, tmp_path, decodes):
    image = tmp_path / "in.png"
    make_image(96, 80).save(image)
    runner, args = _cli_runner(tiny_original, "generate", "--preset", "tiny", "--image", str(image), "--seconds",
                               "1.2", "--steps", "2", "--teacache", "0", "--out", str(tmp_path / "out"), "-q")
    code, last = runner.run(request_from_args(args))
    assert code == 0 and isinstance(last, Done)
    assert [field for field, _ in decodes] == ["image"]


def test_a_batch_decodes_each_image_once(tiny_original, tmp_path, decodes):
    from cli.commands import run_batch

    for name in ("a.png", "b.png"):
        make_image(96, 80).save(tmp_path / name)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"image": "a.png", "seconds": 1.2, "steps": 1}\n{"image": "b.png", "seconds": 1.2, "steps": 1}\n')
    runner, _ = _cli_runner(tiny_original, "batch", str(jobs), "--preset", "tiny", "--out", str(tmp_path / "o"),
                            "-q")
    assert run_batch(runner, jobs) == 0
    assert sorted(source.rsplit("/", 1)[-1] for _, source in decodes) == ["a.png", "b.png"]


def test_the_ui_runner_decodes_the_image_once_per_job(tiny_original, tmp_path, decodes):
    runner = JobRunner(ComponentCache("tiny", loader=lambda preset, mode, model_dir: tiny_original), tmp_path,
                       vram_cap_gb=20, device=torch.device("cpu"))
    ticket = runner.reserve("tab", Request(image=make_image(96, 80), seconds=1.2, steps=1))
    assert len(decodes) == 1                                       # at submit: bad input is refused there
    events = [e for batch in runner.run(ticket) for e in batch]
    assert isinstance(events[-1], Done)
    assert len(decodes) == 1                                       # and never again


def test_a_resume_decodes_the_saved_image_once(tiny_original, tmp_path, decodes):
    cancel = CancelToken()
    prepared = prepare(Request(image=make_image(96, 80), seconds=2.4, steps=2, teacache=0.0), 64)
    for event in generate(prepared, tiny_original, cancel=cancel, outputs=tmp_path):
        if isinstance(event, Progress) and event.section == 2:
            cancel.cancel()
    assert event.stopped
    decodes.clear()
    runner, _ = _cli_runner(tiny_original, "resume", str(event.job_dir), "-q")
    code, last = runner.resume(event.job_dir)
    assert code == 0 and isinstance(last, Done) and not last.stopped
    assert decodes == [("image", str(event.job_dir / "input.png")[:80])]


def test_the_orchestrator_takes_only_a_prepared_request(tiny_original, tmp_path):
    with pytest.raises(TypeError, match="PreparedRequest"):
        next(generate(Request(image=make_image()), tiny_original, outputs=tmp_path))

"""Validation once: the UI/API/CLI check a request (and decode its images) before any model loads, and hand the
orchestrator a PreparedRequest, which never checks or decodes again; a resume likewise."""
from __future__ import annotations

import pytest

import pipeline.request
from cli.commands import Command, build_parser, request_from_args, run_batch, run_generate, run_resume
from configs.options import config_from
from pipeline.cancel import CancelToken
from pipeline.events import Done, Progress
from pipeline.orchestrator import generate
from pipeline.request import Request, prepare
from tests.conftest import make_image
from tests.server_helpers import tiny_runner
from ui.sessions import Sessions


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


def _cli(*argv):
    """The command line's Command for `argv` (the tiny preset: its models are built in code) and its options."""
    parser = build_parser()
    args = parser.parse_args([*argv, "--device", "cpu"])
    return Command(config_from(parser, args), quiet=True, verbose=False, preset_given=args.preset is not None), args


def test_the_cli_decodes_the_image_once_per_job(tmp_path, decodes):
    image = tmp_path / "in.png"
    make_image(96, 80).save(image)
    command, args = _cli("generate", "--preset", "tiny", "--image", str(image), "--seconds", "1.2", "--steps", "2",
                         "--teacache", "0", "--out", str(tmp_path / "out"), "-q")
    try:
        assert run_generate(command, request_from_args(args)) == 0
    finally:
        command.close()
    assert [field for field, _ in decodes] == ["image"]


def test_a_batch_decodes_each_image_once(tmp_path, decodes):
    for name in ("a.png", "b.png"):
        make_image(96, 80).save(tmp_path / name)
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text('{"image": "a.png", "seconds": 1.2, "steps": 1}\n{"image": "b.png", "seconds": 1.2, "steps": 1}\n')
    command, _ = _cli("batch", str(jobs), "--preset", "tiny", "--out", str(tmp_path / "o"), "-q")
    try:
        assert run_batch(command, jobs) == 0
    finally:
        command.close()
    assert sorted(source.rsplit("/", 1)[-1] for _, source in decodes) == ["a.png", "b.png"]


def test_the_runner_decodes_the_image_once_per_job(tiny_original, tmp_path, decodes):
    runner = tiny_runner(tmp_path, tiny_original).start()
    try:
        sessions = Sessions(runner)
        job = sessions.submit(Request(image=make_image(96, 80), seconds=1.2, steps=1), session="tab")
        assert len(decodes) == 1                                   # when it is queued: bad input is refused there
        events = [e for batch in sessions.stream(job) for e in batch]
    finally:
        runner.close(timeout=60)
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
    command, _ = _cli("resume", str(event.job_dir), "-q")
    try:
        assert run_resume(command, event.job_dir) == 0
    finally:
        command.close()
    assert decodes == [("image", str(event.job_dir / "input.png")[:80])]


def test_the_orchestrator_takes_only_a_prepared_request(tiny_original, tmp_path):
    with pytest.raises(TypeError, match="PreparedRequest"):
        next(generate(Request(image=make_image()), tiny_original, outputs=tmp_path))

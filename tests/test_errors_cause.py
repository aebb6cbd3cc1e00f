"""Errors keep their cause: the CLI's model-loading failure keeps its traceback (log file always, terminal with -v);
a bug in resume is not called a damaged job.json; "could not be downloaded" is said for download errors only."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

import pipeline.components as components
import pipeline.resume
from common.errors import InputError, WeightsNotFound
from configs import PRESETS
from jobfolder.checkpoint import save_checkpoint
from jobfolder.folder import Job
from pipeline.sections import Section
from tests.cli_helpers import cli
from tests.conftest import make_image


def test_the_cli_logs_the_loading_traceback_always_and_shows_it_with_verbose(tmp_path, monkeypatch):
    image = tmp_path / "in.png"
    make_image(100, 100).save(image)
    monkeypatch.setenv("STEADYFRAME_CACHE_DIR", str(tmp_path / "cache"))
    from configs.presets import get_preset

    models = tmp_path / "no-models"                 # the weights' folders, with nothing loadable in them
    for src in get_preset("hunyuan").sources("original").values():
        (models / src.repo / (src.subfolder or "")).mkdir(parents=True, exist_ok=True)
        (models / src.repo / (src.subfolder or "") / "config.json").write_text("{}")
    args = ("generate", "--image", image, "--model-dir", models, "--out", tmp_path / "o", "--host-ram-gb", 64)
    quiet = cli(*args)
    log_file = tmp_path / "cache" / "logs" / "cli.log"
    assert quiet.returncode == 1 and "Traceback" not in quiet.stderr
    assert "-v shows the traceback" in quiet.stderr and str(log_file) in quiet.stderr
    logged = log_file.read_text()
    assert "Traceback" in logged and "WeightsNotFound" in logged and "the job failed" in logged
    verbose = cli(*args, "-v")
    assert verbose.returncode == 1 and "Traceback" in verbose.stderr and "WeightsNotFound" in verbose.stderr


def _resumable(folder, settings=None):
    folder.mkdir()
    make_image(64, 64).save(folder / "input.png")
    (folder / "job.json").write_text(json.dumps({"status": "stopped", "settings": settings or {"seed": 1},
                                                 "models": {"preset": "tiny"}}))
    generator = torch.Generator().manual_seed(1)                           # a readable checkpoint (issue 47 checks it)
    history, real, start = (torch.zeros(1, 16, 1, 8, 8) for _ in range(3))
    save_checkpoint(Job(folder, {}), Section(0, 2, 0), history, real, start, None, generator)
    return folder


def test_a_type_error_in_resume_is_not_called_a_damaged_job_json(tmp_path, monkeypatch):
    job = _resumable(tmp_path / "job")
    assert pipeline.resume.prepare_resume(job).request.seed == 1            # the folder itself is fine

    def bug(settings, default_resolution=640):
        raise TypeError("unsupported operand type(s) (a bug, not the file)")

    monkeypatch.setattr(pipeline.resume, "setting_problems", bug)
    with pytest.raises(TypeError, match="a bug, not the file"):
        pipeline.resume.prepare_resume(job)


def test_the_runner_does_not_call_a_bug_a_damaged_job_json(tmp_path, monkeypatch, tiny_original):
    from tests.server_helpers import tiny_runner

    runner = tiny_runner(tmp_path, tiny_original)
    job = _resumable(tmp_path / "20250101-000000-abcdef")
    monkeypatch.setattr(pipeline.resume, "prepare", lambda *a, **k: (_ for _ in ()).throw(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        runner.submit_resume(job, waited_on=True)
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "job.json").write_text('{"settings": ')
    with pytest.raises(InputError, match="damaged or incomplete"):
        runner.submit_resume(tmp_path / "damaged", waited_on=True)
    assert runner.store.entries() == []


@pytest.mark.parametrize("error", [OSError("No space left on device"), httpx.ConnectError("connection refused")])
def test_download_errors_say_the_weights_could_not_be_downloaded(monkeypatch, error):
    def fail(src):
        raise error

    monkeypatch.setattr(components, "_snapshot_folder", fail)
    preset = PRESETS["hunyuan"]
    role, src = next(iter(preset.sources("original").items()))
    with pytest.raises(WeightsNotFound, match="could not be downloaded"):
        components.resolve(preset, "original", role, src, None)


def test_other_errors_while_fetching_weights_keep_their_type(monkeypatch):
    def bug(src):
        raise TypeError("snapshot_download() got an unexpected keyword argument (a bug)")

    monkeypatch.setattr(components, "_snapshot_folder", bug)
    preset = PRESETS["hunyuan"]
    role, src = next(iter(preset.sources("original").items()))
    with pytest.raises(TypeError, match="a bug"):
        components.resolve(preset, "original", role, src, None)

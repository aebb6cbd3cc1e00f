"""Nothing lost: a job killed at any moment resumes to the same final latents and video as an uninterrupted run."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from jobfolder.checkpoint import CHECKPOINT, load_checkpoint
from tests.cli_helpers import cli, killed_after
from tests.cli_helpers import cli_env as _env
from tests.cli_helpers import sections_done as _sections_done
from tests.conftest import ROOT, job_folders
from tests.kill_helpers import tail
from video.mp4 import read_frames

SETTINGS = ["--preset", "tiny", "--prompt", "a lighthouse in a storm", "--seconds", "4.8", "--steps", "4",
            "--seed", "11", "--teacache", "0.1"]


@pytest.fixture(scope="module")
def uninterrupted(image, tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    r = cli("generate", "--image", image, *SETTINGS, "--out", out)
    assert r.returncode == 0, r.stderr
    (job,) = job_folders(out)
    raw_hash = json.loads((job / "job.json").read_text())["sections"][-1]["frames_sha256"]
    return load_checkpoint(job)[0]["real"], (job / "final.mp4").read_bytes(), raw_hash


def _assert_same_result(job, uninterrupted):
    real, video, raw_hash = uninterrupted
    info = json.loads((job / "job.json").read_text())
    assert info["status"] == "done" and info["resumed"] >= 1
    torch.testing.assert_close(load_checkpoint(job)[0]["real"], real, atol=0, rtol=0)
    assert info["sections"][-1]["frames_sha256"] == raw_hash           # the frames handed to the encoder: equal
    # and so is the file: the encoder's bytes depend only on the frames and configs.video (tests/test_video.py)
    assert (job / "final.mp4").read_bytes() == video
    assert read_frames(job / "final.mp4").shape[0] == info["sections"][-1]["frames"]
    assert not list(job.glob(".*tmp"))


@pytest.mark.parametrize("kill_after", [1, 2])
def test_sigkill_after_a_section_then_resume_equals_uninterrupted(image, uninterrupted, tmp_path, kill_after):
    out = tmp_path / "out"
    job, proc = killed_after(kill_after, out, "generate", "--image", image, *SETTINGS, "--out", out, "-q")
    assert job is not None, f"the job never reached section {kill_after}: {tail(proc.err, 2000)}"
    assert proc.exitcode == -signal.SIGKILL
    done_at_kill = _sections_done(job)
    assert kill_after <= done_at_kill < 4
    assert json.loads((job / "job.json").read_text())["status"] == "running"      # died mid-job
    assert not (job / "final.mp4").exists()

    r = cli("resume", job, "-q")
    assert r.returncode == 0, r.stderr
    _assert_same_result(job, uninterrupted)


def test_kill_during_a_checkpoint_write_keeps_the_previous_one(image, uninterrupted, tmp_path):
    """The child dies (SIGKILL) halfway through writing the second checkpoint's temp file."""
    out = tmp_path / "out"
    child = textwrap.dedent(f"""
        import os, signal, sys
        sys.argv = ["pipeline", "generate", "--image", {str(image)!r}, *{SETTINGS!r}, "--out", {str(out)!r}, "-q"]
        import jobfolder.checkpoint as ckpt
        real_write, calls = ckpt.atomic_write_bytes, []
        def dying_write(path, data):
            calls.append(path)
            if len(calls) == 2:
                with open(path.with_name("." + path.name + ".dead.tmp"), "wb") as f:
                    f.write(data[: len(data) // 2])
                    f.flush()
                    os.kill(os.getpid(), signal.SIGKILL)
            real_write(path, data)
        ckpt.atomic_write_bytes = dying_write
        from cli.commands import main
        main(sys.argv[1:])
    """)
    r = subprocess.run([sys.executable, "-c", child], cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr
    (job,) = job_folders(out)
    assert list(job.glob(".*.dead.tmp"))                          # the half-written file is there...
    tensors, meta = load_checkpoint(job)                         # ...and the previous checkpoint still loads
    assert meta["sections_done"] == 1 and torch.isfinite(tensors["real"]).all()
    assert (job / CHECKPOINT).stat().st_size > 0

    r = cli("resume", job, "-q")
    assert r.returncode == 0, r.stderr
    _assert_same_result(job, uninterrupted)


def test_resume_refuses_foreign_or_damaged_folders(tmp_path):
    r = cli("resume", tmp_path)
    assert r.returncode == 2 and "no job.json" in r.stderr
    (tmp_path / "job.json").write_text('{"status": "running", "settings": ')
    r = cli("resume", tmp_path)
    assert r.returncode == 2 and "damaged or incomplete" in r.stderr and "Traceback" not in r.stderr

"""Issue 47 item 5: every fault a user can cause or meet ends in one clear line (the field or file, what to do), exit
2 for what the user can fix in the command, 1 for a fault of the machine, the job left resumable and marked so; a
traceback only in the log file. Before: a full disk gave 141 lines with 8 tracebacks and left the job "running";
`--out <a file>` a NotADirectoryError traceback; a read-only outputs folder a traceback; resuming a running job 21
lines ending in SessionBusy; a typo in a value (`--mode F1`, `--seconds five`) a 28-line usage block."""
from __future__ import annotations

import errno
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from jobs import store as qs
from tests.conftest import ROOT
from tests.kill_helpers import KillAt, job_folder, shared, tail

JOB = ["--preset", "tiny", "--prompt", "a field of wheat", "--seconds", "3.3", "--steps", "2", "--seed", "9"]


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def cli(*args):
    return shared().completed([str(a) for a in args], env=_env(), timeout=300)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES], ids=["ENOSPC", "EROFS", "EACCES"])
def test_a_full_or_read_only_disk_ends_in_one_line_and_the_job_resumes_once_it_is_fixed(image, tmp_path, code):
    """The disk fills, or the folder turns read-only (a remount) or unwritable (its permissions changed) during
    the job: one line naming the folder and what to do, exit 1, the job failed and resumable."""
    out = tmp_path / "out"
    proc = shared().start("generate", "--image", image, *JOB, "--out", out, "-q", separate=True, env=_env(),
                          kill_at=KillAt("jobfolder.checkpoint:atomic_write_bytes", 2, errno=code))
    proc.join(300)
    err, said = tail(proc.err, None), tail(proc.log, None)
    job = job_folder(out)
    assert proc.exitcode == 1, err
    what = ("the disk is full" if code == errno.ENOSPC else f"it cannot be written ({os.strerror(code)})")
    fix = "free some space" if code == errno.ENOSPC else "make it writable"
    assert err.strip().splitlines() == [
        f"error: {job}: {what}; the job stopped after its last finished section: {fix}, then "
        f"resume it (python -m cli resume {job}) (-v shows the traceback; it is in "
        f"{err.split('; it is in ')[-1].rstrip(')' + chr(10))})"]
    assert "Traceback" not in err + said
    info = json.loads((job / "job.json").read_text())
    assert info["status"] == "failed" and what in info["error"]
    store, _ = qs.QueueStore.open(out)
    assert [e.status for e in store.entries()] == [qs.FAILED]
    store.close()
    if code != errno.ENOSPC:
        return                                            # the resume is the same as after a full disk
    r = cli("resume", job, "-q")                          # space freed: it continues from its last section
    assert r.returncode == 0, r.stderr
    assert json.loads((job / "job.json").read_text())["status"] == "done"


def test_out_naming_a_file_is_one_line(image, tmp_path):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    r = cli("generate", "--image", image, *JOB, "--out", a_file)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"python -m cli: error: --out: {a_file} is a file, not a folder; give a folder (it is made when missing) "
        f"(`python -m cli -h` lists the options)"]
    assert a_file.read_text() == "mine"
    r = cli("generate", "--image", image, *JOB, "--out", a_file / "jobs")
    assert r.returncode == 2 and f"--out: {a_file} is a file, not a folder" in r.stderr


@pytest.mark.parametrize("option, value, said", [
    ("--mode", "F1", "argument --mode: invalid choice: 'F1' (choose from 'original', 'f1')"),
    ("--seconds", "five", "argument --seconds: invalid float value: 'five'"),
])
def test_a_typo_in_a_value_is_one_line(image, tmp_path, option, value, said):
    r = cli("generate", "--image", image, option, value, "--out", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"python -m cli generate: error: {said} (`python -m cli generate -h` lists the options)"]
    assert not (tmp_path / "out").exists()


def _read_only(folder: Path):
    """Make `folder` read-only for this process: its mode bits (not root), or a read-only tmpfs (root may write
    through mode bits; mounting needs CAP_SYS_ADMIN)."""
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("running as root without the right to mount: no read-only folder can be made here")
    return lambda: subprocess.run(["umount", str(folder)], check=True)


def test_a_read_only_outputs_folder_is_one_line(image, tmp_path):
    out = tmp_path / "readonly"
    undo = _read_only(out)
    try:
        r = cli("generate", "--image", image, *JOB, "--out", out, "-q")
    finally:
        undo()
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [
        f"error: --out: cannot write in {out} (Read-only file system); give a folder you can write to"
        if os.geteuid() == 0 else
        f"error: --out: cannot write in {out} (Permission denied); give a folder you can write to"]
    assert list(out.iterdir()) == []


def test_resuming_a_job_that_runs_is_one_line(image, tmp_path):
    out = tmp_path / "out"
    proc = shared().start("generate", "--image", image, *JOB[:-4], "--seconds", "20", "--steps", "4", "--out", out,
                          "-q", separate=True, env=_env())
    deadline = time.monotonic() + 120
    while job_folder(out) is None or not (job_folder(out) / "section_01.mp4").is_file():
        assert time.monotonic() < deadline and proc.is_alive(), tail(proc.err)
        time.sleep(0.05)
    job = job_folder(out)
    try:
        r = cli("resume", job)
    finally:
        proc.kill()
        proc.join()
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: job folder: job {job.name} is already running or waiting to run; wait for it to end, or stop it "
        f"where it runs"]


# ---- item 6: small ones -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, line", [
    (["--seed", "-1"], "error: --seed: -1 is out of range; use a value between 0 and 9223372036854775807"),
    (["--lora", "nope.safetensors"], "error: --lora: nope.safetensors: not in the LoRA folder, --lora-dir "),
])
def test_messages_name_the_option_and_whole_bounds(image, tmp_path, argv, line):
    r = cli("generate", "--image", image, *JOB, *argv, "--lora-dir", tmp_path / "loras", "--out", tmp_path / "out",
            "-q")
    assert r.returncode == 2
    (said,) = r.stderr.strip().splitlines()
    assert said.startswith(line), said
    assert not (tmp_path / "out").exists()


def test_a_missing_input_png_is_named_not_blamed_on_image(image, tmp_path):
    out = tmp_path / "out"
    proc = shared().start("generate", "--image", image, *JOB, "--out", out, "-q", separate=True, env=_env(),
                          kill_at=KillAt("pipeline.orchestrator:save_checkpoint", 1, after=True))
    proc.join(300)
    job = job_folder(out)
    (job / "input.png").unlink()
    assert (job / "upload.png").is_file()
    r = cli("resume", job)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"error: job folder: {job / 'input.png'} is missing (the job's prepared start image); put it back, or start "
        f"a new job from {job / 'upload.png'}"]


def test_the_app_with_a_read_only_outputs_folder_says_one_line(tmp_path, caplog):
    """Before: the app died at its start with a traceback."""
    import logging

    import app
    from tests.server_helpers import free_port

    out = tmp_path / "readonly"
    undo = _read_only(out)
    try:
        with caplog.at_level(logging.ERROR):
            code = app.main(["--preset", "tiny", "--outputs", str(out), "--port", str(free_port())])
    finally:
        undo()
    why = "Read-only file system" if os.geteuid() == 0 else "Permission denied"
    assert code == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == [
        f"--outputs: cannot write in {out} ({why}); give a folder you can write to"]

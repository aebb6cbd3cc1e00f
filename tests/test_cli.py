"""The command line, run as a user would: `python -m cli generate|batch` on the tiny preset."""
from __future__ import annotations

import json
import os

from pipeline.sections import make_plan
from tests.cli_helpers import cli
from tests.conftest import ROOT, job_folders, make_image
from tests.kill_helpers import shared
from video.mp4 import read_frames


def test_generate_writes_a_playable_mp4_with_the_planned_frames(tmp_path):
    image = tmp_path / "in.png"
    make_image(160, 120).save(image)
    out = tmp_path / "outputs"
    r = cli("generate", "--preset", "tiny", "--image", image, "--prompt", "waves roll in", "--seconds", 2.4,
            "--steps", 3, "--seed", 5, "--out", out)
    assert r.returncode == 0, r.stderr
    (job,) = job_folders(out)
    final = job / "final.mp4"
    assert f"done: {final}" in r.stdout
    expected = make_plan("original", 2.4, 9).frame_counts()
    assert read_frames(final).shape[0] == expected[-1] == 73
    assert [read_frames(job / f"section_{i:02d}.mp4").shape[0] for i in (1, 2)] == expected
    info = json.loads((job / "job.json").read_text())
    assert info["status"] == "done" and info["settings"]["seed"] == 5


def test_generate_bad_input_exits_2_names_the_field_and_writes_nothing(tmp_path):
    out = tmp_path / "outputs"
    r = cli("generate", "--preset", "tiny", "--image", tmp_path / "missing.png", "--out", out)
    assert r.returncode == 2 and "image: file not found" in r.stderr
    image = tmp_path / "in.png"
    make_image(100, 100).save(image)
    r = cli("generate", "--preset", "tiny", "--image", image, "--steps", 500, "--out", out)
    assert r.returncode == 2 and "steps:" in r.stderr and "between 1 and 100" in r.stderr
    r = cli("generate", "--preset", "tiny", "--image", image, "--crf", 99, "--out", out)
    assert r.returncode == 2 and "crf:" in r.stderr
    assert not out.exists()


def test_missing_real_weights_explain_the_tiny_preset(tmp_path):
    image = tmp_path / "in.png"
    make_image(100, 100).save(image)
    (tmp_path / "no-models").mkdir()
    # the missing weights are said first, whatever the host-RAM budget (issue 33 item 8: before, a small machine
    # heard only that its budget was too small, with advice that changed nothing)
    r = cli("generate", "--image", image, "--model-dir", tmp_path / "no-models", "--out", tmp_path / "o")
    assert r.returncode == 2
    assert "--preset tiny" in r.stderr and "no-models" in r.stderr and "Traceback" not in r.stderr
    assert "host RAM" not in r.stderr and not (tmp_path / "o").exists()


def test_batch_runs_every_line_and_summarises(tmp_path):
    make_image(100, 80).save(tmp_path / "a.png")
    lines = [
        json.dumps({"image": "a.png", "prompt": "first", "seconds": 1.2, "steps": 2}),
        json.dumps({"image": "missing.png", "prompt": "second"}),
        "{not json",
        json.dumps({"image": "a.png", "prompt": "third", "seconds": 1.2, "steps": 2, "mode": "f1", "seed": 9}),
        json.dumps({"image": "a.png", "colour": "blue"}),
    ]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    r = cli("batch", jobs, "--preset", "tiny", "--out", tmp_path / "outputs", timeout=400)
    assert r.returncode == 1, r.stderr                       # not all jobs succeeded
    summary = r.stdout[r.stdout.index("batch summary"):]
    assert "line   1: done" in summary and "line   4: done" in summary
    # every bad line is refused before the first job runs (a missing image too), the good ones still run
    assert "line   2: invalid" in summary and "line   3: invalid" in summary and "line   5: invalid" in summary
    assert "missing.png" in r.stderr and r.stderr.index("line 5: invalid") < r.stderr.index("running the other 2")
    assert "2/5 jobs done" in summary
    done_jobs = [json.loads((d / "job.json").read_text()) for d in job_folders(tmp_path / "outputs")]
    assert sorted(j["settings"]["prompt"] for j in done_jobs) == ["first", "third"]
    assert all(j["status"] == "done" for j in done_jobs)


def test_help_lists_the_commands():
    r = cli("--help")
    assert r.returncode == 0 and "generate" in r.stdout and "batch" in r.stdout
    r = cli("generate", "--help")
    assert "--end-image" in r.stdout and "--model-dir" in r.stdout and "--preset" in r.stdout


def test_batch_refuses_absurd_lines_at_once_without_loading_models(tmp_path):
    """A JSON-lines file whose jobs all ask for absurd values is refused line by line before any model loads."""
    make_image(100, 80).save(tmp_path / "a.png")
    lines = [json.dumps({"image": "a.png", "seconds": 1e12}),
             json.dumps({"image": "a.png", "seconds": 120, "latent_window": 1, "steps": 10**9}),
             json.dumps({"image": "a.png", "seconds": "nan"}),
             json.dumps({"image": "a.png", "mode": "x" * 100_000}),
             "[" * 100_000]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    r = cli("batch", jobs, "--preset", "tiny", "--out", tmp_path / "outputs", timeout=120)
    assert r.returncode == 2                                     # every line invalid: an input error (issue 33)
    assert "line 1: invalid: seconds: 1000000000000.0 is out of range" in r.stderr
    assert "line 2: invalid: steps: 1000000000 is out of range" in r.stderr
    assert "line 3: invalid: seconds: nan is not a finite number" in r.stderr
    assert "line 4: invalid: mode: 'xxxx" in r.stderr and len(r.stderr) < 5000       # the value is not echoed whole
    assert "line 5: invalid" in r.stderr and "0/5 jobs done" in r.stdout
    assert not (tmp_path / "outputs").exists()                   # nothing ran, nothing was written


def test_a_second_ctrl_c_aborts_in_one_line_and_the_job_can_be_resumed(tmp_path):
    """Issue 33 item 11: a second Ctrl-C printed a ~60-line KeyboardInterrupt traceback and left job.json "running".
    The job is held inside its first convolution (an injected 60 s hang), where a step cannot end: the first Ctrl-C
    asks for a stop, the second aborts at once."""
    import signal
    import time

    from tests.kill_helpers import job_folder, tail

    image = tmp_path / "in.png"
    make_image(96, 80).save(image)
    out = tmp_path / "outputs"
    hang = json.dumps([{"tier": 1, "kind": "hang", "seconds": 60, "op": "conv3d"}])
    env = dict(os.environ, HF_HUB_OFFLINE="1", STEADYFRAME_CONV_FAULTS=hang,
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    proc = shared().start("generate", "--preset", "tiny", "--image", image, "--seconds", 1.2, "--steps", 2,
                          "--out", out, separate=True, env=env)
    deadline = time.monotonic() + 60
    while job_folder(out) is None or not (job_folder(out) / "job.json").is_file():
        assert time.monotonic() < deadline and proc.is_alive(), tail(proc.err)
        time.sleep(0.1)
    time.sleep(0.3)                               # inside the hung convolution
    os.kill(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    os.kill(proc.pid, signal.SIGINT)
    proc.join(20)
    err = tail(proc.err, None)
    assert proc.exitcode == 130, err
    assert "Traceback" not in err and "aborted; the sections made so far are in" in err
    info = json.loads((job_folder(out) / "job.json").read_text())
    assert info["status"] == "stopped"

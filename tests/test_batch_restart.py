"""What `python -m cli batch` does when it is killed and run again (as the README says): it keeps no queue, so
the second run runs every line again from the start, in new job folders; the killed line's folder is left as it
was (status "running", its checkpoint) and `python -m cli resume` continues it to the very video the rerun's
same line made. (A list of jobs that continues by itself is the app's queue: `python -m cli queue add`.)"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from pipeline.checkpoint import load_checkpoint
from tests.conftest import ROOT, make_image
from tests.test_cli import cli
from tests.test_resume import _env, _sections_done

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _info(job) -> dict:
    return json.loads((job / "job.json").read_text())


def test_a_killed_batch_runs_again_from_the_start_and_its_killed_job_resumes(tmp_path):
    make_image(128, 96, seed=3).save(tmp_path / "in.png")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": "in.png", "prompt": "long", "seconds": 4.8, "steps": 4, "seed": 2}) + "\n" +
                    json.dumps({"image": "in.png", "prompt": "short", "seconds": 1.2, "steps": 2, "seed": 3}) + "\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "cli", "batch", str(jobs), "--preset", "tiny", "--out",
                             str(out), "-q"], cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True)
    killed = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and proc.poll() is None:
        folders = list(out.iterdir()) if out.exists() else []
        if folders and _sections_done(folders[0]) >= 1:
            killed = folders[0]
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait(timeout=30)
    assert killed is not None, proc.stderr.read()[-2000:]
    assert _info(killed)["status"] == "running" and _info(killed)["settings"]["prompt"] == "long"
    at_kill = (killed / "job.json").read_bytes(), load_checkpoint(killed)[1]["sections_done"]

    r = cli("batch", jobs, "--preset", "tiny", "--out", out, "-q", timeout=600)
    assert r.returncode == 0, r.stderr
    assert "2/2 jobs done" in r.stdout
    again = sorted(d for d in out.iterdir() if d != killed)
    assert [_info(d)["settings"]["prompt"] for d in again] == ["long", "short"]     # every line again, new folders
    assert all(_info(d)["status"] == "done" and "resumed" not in _info(d) for d in again)
    assert ((killed / "job.json").read_bytes(), load_checkpoint(killed)[1]["sections_done"]) == at_kill   # untouched

    r = cli("resume", killed, "-q")
    assert r.returncode == 0, r.stderr
    assert _info(killed)["status"] == "done" and _info(killed)["resumed"] == 1
    assert (killed / "final.mp4").read_bytes() == (again[0] / "final.mp4").read_bytes()

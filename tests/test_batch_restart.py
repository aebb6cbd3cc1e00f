"""What `python -m cli batch` does when it is killed (as the README says): its jobs are entries of the outputs
folder's queue, so they stay there; `python -m cli queue run` (or the app, at its start) runs them: the killed job
continues in its folder, to the very video an uninterrupted run of it makes, and the lines it had not reached run
after it."""
from __future__ import annotations

import json

import pytest

from jobfolder.checkpoint import load_checkpoint
from tests.cli_helpers import cli, killed_after
from tests.conftest import job_folders, make_image
from tests.kill_helpers import tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def _info(job) -> dict:
    return json.loads((job / "job.json").read_text())


def test_a_killed_batch_leaves_its_jobs_queued_and_queue_run_finishes_them(tmp_path):
    make_image(128, 96, seed=3).save(tmp_path / "in.png")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": "in.png", "prompt": "long", "seconds": 4.8, "steps": 4, "seed": 2}) + "\n" +
                    json.dumps({"image": "in.png", "prompt": "short", "seconds": 1.2, "steps": 2, "seed": 3}) + "\n")
    out = tmp_path / "out"
    killed, proc = killed_after(1, out, "batch", jobs, "--preset", "tiny", "--out", out, "-q")
    assert killed is not None, tail(proc.err, 2000)
    assert _info(killed)["status"] == "running" and _info(killed)["settings"]["prompt"] == "long"
    at_kill = load_checkpoint(killed)[1]["sections_done"]

    r = cli("queue", "run", "--preset", "tiny", "--out", out, "-q", timeout=600)
    assert r.returncode == 0, r.stderr
    assert "2/2 jobs done" in r.stdout
    (short,) = [d for d in job_folders(out) if d != killed]                  # no line ran twice
    assert _info(short)["settings"]["prompt"] == "short" and _info(short)["status"] == "done"
    assert _info(killed)["status"] == "done" and _info(killed)["resumed"] == 1
    assert load_checkpoint(killed)[1]["sections_done"] > at_kill             # it went on from where it was

    r = cli("generate", "--image", tmp_path / "in.png", "--prompt", "long", "--seconds", 4.8, "--steps", 4,
            "--seed", 2, "--preset", "tiny", "--out", tmp_path / "alone", "-q")
    assert r.returncode == 0, r.stderr
    (alone,) = job_folders(tmp_path / "alone")
    assert (killed / "final.mp4").read_bytes() == (alone / "final.mp4").read_bytes()

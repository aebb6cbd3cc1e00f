"""Issue 44 item 4: a job whose process was killed is "interrupted", not "running": `queue list` says so, `queue
remove` takes it out of the queue (before, it refused: "press End", and the command line has no End), and the next
`cli generate` runs its own job, not the old one first (before, it silently finished the killed job, then its own).
Its folder stays, to be resumed (`python -m cli resume`, the page's Resume, /resume)."""
from __future__ import annotations

import json

import pytest

from tests.cli_helpers import cli, killed_after
from tests.conftest import job_folders, make_image
from tests.kill_helpers import tail

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def test_a_killed_batch_job_is_interrupted_removable_and_not_run_by_the_next_generate(tmp_path):
    make_image(96, 80).save(tmp_path / "in.png")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(json.dumps({"image": "in.png", "prompt": "the killed one", "seconds": 4.8, "steps": 4}) + "\n"
                    + json.dumps({"image": "in.png", "prompt": "never reached", "seconds": 1.2, "steps": 2}) + "\n")
    out = tmp_path / "out"
    killed, proc = killed_after(1, out, "batch", jobs, "--preset", "tiny", "--out", out, "-q")
    assert killed is not None, tail(proc.err, 2000)

    listed = cli("queue", "list", "--json", "--out", out)
    assert listed.returncode == 0, listed.stderr
    rows = [json.loads(line) for line in listed.stdout.splitlines()]
    (old,) = [r for r in rows if r["prompt"] == "the killed one"]
    assert old["status"] == "interrupted" and old["job_id"] == killed.name, rows
    assert "interrupted" in cli("queue", "list", "--out", out).stdout

    removed = cli("queue", "remove", old["id"], "--out", out)
    assert removed.returncode == 0, removed.stderr
    assert old["id"] not in cli("queue", "list", "--out", out).stdout
    assert (killed / "job.json").is_file()                          # its folder stays, to be resumed

    r = cli("generate", "--image", tmp_path / "in.png", "--prompt", "a new one", "--seconds", 1.2, "--steps", 2,
            "--preset", "tiny", "--out", out, "-q", timeout=300)
    assert r.returncode == 0, r.stderr
    new = [d for d in job_folders(out) if d != killed]
    assert [json.loads((d / "job.json").read_text())["settings"]["prompt"] for d in new] == ["a new one"]
    assert not (killed / "final.mp4").exists()                     # the killed job did not run first (nor after)
    waiting = [json.loads(line) for line in cli("queue", "list", "--json", "--out", out).stdout.splitlines()]
    assert [(w["prompt"], w["status"]) for w in waiting if w["prompt"] == "never reached"] == [
        ("never reached", "waiting")]                             # the batch's other line waits for `queue run`


def test_a_job_another_process_runs_is_not_told_it_waits_behind_itself(tmp_path):
    """Issue 44 item 3: the command line following the app's queue said "2nd in line" about its own job while the
    app ran it (its own running entry was counted ahead of it). Its place is what is really ahead of it."""
    from types import SimpleNamespace

    from jobs import store as qs
    from jobs.follow import QueueLine
    from jobs.runner import QueuedJob, Runner

    store, _ = qs.QueueStore.open(tmp_path)
    first, mine, later = store.add_many([{"prompt": p} for p in ("first", "mine", "later")], origin="cli")
    line = QueueLine(Runner(store, SimpleNamespace(slots=1), SimpleNamespace(default_resolution=64)))
    job = QueuedJob(mine.id, "cli")
    assert line.waiting(job).ahead == 1                      # "first" waits ahead of it: 2nd in line
    assert store.claim(first.id)                               # another process runs "first"
    assert line.waiting(job).ahead == 1
    store.update(first.id, status=qs.DONE)
    assert line.waiting(job) is None                          # nothing ahead: no "2nd in line"
    assert store.claim(mine.id)                                # the app runs it now
    assert line.waiting(job) is None and line.waiting(QueuedJob(later.id, "cli")).ahead == 1

"""Issue 47 item 3: the queue's lease is held while its holder lives. On this computer a holder whose process is
alive keeps it however long since it renewed it (a paused process is not gone); on another computer a holder that
stopped renewing for LEASE_STALE_S is gone, and a runner that finds its lease taken stops its jobs there and writes
nothing more (never two runners on one job). Before, a `cli` paused with SIGSTOP for 45 s lost its job to a
`queue run`, and both ran it to the end."""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time

from jobs import store as qs
from tests.conftest import ROOT, make_image
from tests.kill_helpers import job_folder, shared, tail

JOB = ["--preset", "tiny", "--prompt", "a quiet street", "--seconds", "12", "--steps", "4", "--seed", "8", "-q"]


def _env():
    return dict(os.environ, HF_HUB_OFFLINE="1",
                PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))


def _held(out) -> dict:
    with sqlite3.connect(qs.QueueStore(out).path) as db:
        return json.loads(db.execute("SELECT value FROM meta WHERE key = 'runner'").fetchone()[0])


def _set_lease(out, lease: dict) -> None:
    with sqlite3.connect(qs.QueueStore(out).path, timeout=10) as db:
        db.execute("UPDATE meta SET value = ? WHERE key = 'runner'", (json.dumps(lease),))


def test_who_holds_a_lease():
    now = time.time()
    mine = qs._lease("t", now - 3600)                     # renewed an hour ago, by this live process
    assert not qs._lease_gone(mine, now)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert qs._lease_gone({**mine, "pid": int(ended.stdout)}, now)                   # its process ended
    assert qs._lease_gone({**mine, "started": mine["started"] - 100}, now)           # its pid is another's now
    far = {**mine, "host": socket.gethostname() + "-elsewhere"}
    assert not qs._lease_gone({**far, "renewed": now - 5}, now)
    assert qs._lease_gone({**far, "renewed": now - qs.LEASE_STALE_S - 1}, now)     # it stopped renewing there


def _running_job(tmp_path):
    image = tmp_path / "in.png"
    make_image(128, 96, seed=6).save(image)
    out = tmp_path / "out"
    proc = shared().start("generate", "--image", image, *JOB, "--out", out, separate=True, env=_env())
    deadline = time.monotonic() + 120
    while job_folder(out) is None or not (job_folder(out) / "section_01.mp4").is_file():
        assert time.monotonic() < deadline and proc.is_alive(), tail(proc.err)
        time.sleep(0.05)
    return out, proc


def test_a_paused_runner_keeps_its_job_from_a_second_queue_run(tmp_path):
    out, first = _running_job(tmp_path)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        lease = _held(out)
        _set_lease(out, {**lease, "renewed": time.time() - 120})        # paused for two minutes
        second = shared().start("queue", "run", "--preset", "tiny", "--out", out, "-q", separate=True, env=_env())
        time.sleep(6)                                                   # it follows; it does not take the job
        assert second.is_alive(), tail(second.err)
        assert _held(out)["token"] == lease["token"]
        second.kill()
        second.join()
    finally:
        os.kill(first.pid, signal.SIGCONT)
    first.join(180)
    assert first.exitcode == 0, tail(first.err)
    info = json.loads((job_folder(out) / "job.json").read_text())
    assert info["status"] == "done" and "resumed" not in info          # one runner ran it, once


def test_a_runner_that_lost_its_lease_stops_its_job_and_writes_nothing(tmp_path):
    out, proc = _running_job(tmp_path)
    folder = job_folder(out)
    taker = {"token": "another", "pid": 1, "started": None, "host": socket.gethostname() + "-elsewhere",
             "renewed": time.time() + 3600}
    _set_lease(out, taker)                               # a runner on another computer took the queue over
    before = json.loads((folder / "job.json").read_text())
    proc.join(60)
    assert proc.exitcode is not None, "the job ran on after its lease was lost"
    assert "lost the queue's lease to another; its 1 running job(s) stop here and continue there" in tail(proc.err)
    info = json.loads((folder / "job.json").read_text())
    assert info["status"] == "running" and not (folder / "final.mp4").exists()
    assert info["videos"][:len(before["videos"])] == before["videos"]
    store, _ = qs.QueueStore.open(out)
    (entry,) = store.entries()
    assert entry.status == qs.RUNNING and _held(out)["token"] == "another"     # the taker's, untouched
    store.close()

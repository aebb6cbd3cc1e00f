"""Issue 44: the command line says a waiting batch line's expected wait as the page does (jobs/follow.py QueueLine,
at the speed of jobs/line.py's JobRates), from the newest job of the outputs folder that ended done, before this
process has timed a job of its own."""
from __future__ import annotations

import json
from types import SimpleNamespace

from jobs.line import Speed
from jobs.text import format_seconds
from tests.cli_helpers import cli
from tests.conftest import make_image

TIMINGS = {"transformer": 8.0, "VAE decode": 4.0, "total": 14.0}    # an earlier job's (written as a job writes them)


def _earlier_job(outputs, name, status="done", **settings):
    folder = outputs / name
    folder.mkdir(parents=True)
    (folder / "job.json").write_text(json.dumps({"id": name, "status": status, "timings": TIMINGS, "settings": {
        "mode": "original", "seconds": 2.4, "latent_window": 9, "fps": 30, "steps": 4, "resolution": 64,
        "prompt": "earlier", **settings}}))


def test_a_batch_says_each_waiting_lines_expected_wait(tmp_path):
    outputs = tmp_path / "outputs"
    _earlier_job(outputs, "20250101-000000-aaaaaa")                         # done: its speed is learnt
    _earlier_job(outputs, "20250101-000001-bbbbbb", status="failed", steps=1000)   # newer, but not done: not used
    make_image(100, 80).save(tmp_path / "a.png")
    line = {"image": "a.png", "prompt": "first", "seconds": 1.2, "steps": 2, "resolution": 64}
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(json.dumps({**line, "prompt": p}) for p in ("first", "second", "third")) + "\n")
    r = cli("batch", jobs, "--preset", "tiny", "--out", outputs, timeout=400)
    assert r.returncode == 0, r.stderr
    speed = Speed(64)
    speed.learn(SimpleNamespace(mode="original", seconds=2.4, latent_window=9, fps=30, steps=4, resolution=64,
                                width=0, height=0), TIMINGS)
    one = speed.expected_seconds(SimpleNamespace(**{**line, "mode": "original", "latent_window": 9, "fps": 30,
                                                    "width": 0, "height": 0}))
    queued = [text for text in r.stdout.splitlines() if "(queued as" in text]
    assert len(queued) == 3 and "Waiting" not in queued[0], r.stdout        # the first starts at once
    assert queued[1].endswith(f"you are 2nd in line (1 job ahead of yours). It should start in about "
                              f"{format_seconds(one)}."), queued
    assert queued[2].endswith(f"It should start in about {format_seconds(2 * one)}."), queued

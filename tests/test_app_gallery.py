"""Past jobs from outputs/ (job.json) for the gallery and "reuse settings"."""
from __future__ import annotations

import json
import os

from pipeline.jobs import Job
from pipeline.request import Request
from tests.conftest import make_image
from ui import jobs_gallery as jg
from ui import settings as st


def _job(outputs, name, status, prompt="a cat", final=True, sections=2):
    settings = Request(image=None, prompt=prompt, seconds=2.4, seed=7, steps=3, resolution=64).settings()
    job = Job.create(outputs, settings, {"preset": "tiny"})
    job.save_image("input.png", make_image(64, 48))
    videos = []
    for n in range(1, sections + 1):
        (job.dir / f"section_{n:02d}.mp4").write_bytes(b"mp4")
        videos.append(f"section_{n:02d}.mp4")
    job.update(videos=videos)
    last = job.dir / videos[-1] if (final and videos) else None
    job.finish(status, last, error="boom" if status == "failed" else None, timings={"total": 1.0})
    target = job.dir.with_name(name)
    os.rename(job.dir, target)
    return target


def test_list_jobs_newest_first_and_skips_unreadable(tmp_path):
    old = _job(tmp_path, "20250101-000000-aaaaaa", "done")
    new = _job(tmp_path, "20250102-000000-bbbbbb", "stopped", prompt="x" * 80)
    (tmp_path / "20250103-000000-cccccc").mkdir()                          # no job.json
    bad = tmp_path / "20250104-000000-dddddd"
    bad.mkdir()
    (bad / "job.json").write_text("{not json")
    (tmp_path / "stray.txt").write_text("hi")
    entries = jg.list_jobs(tmp_path)
    assert [e.dir for e in entries] == [new, old]
    assert jg.list_jobs(tmp_path / "missing") == []
    assert len(jg.list_jobs(tmp_path, limit=1)) == 1

    items = jg.gallery_items(entries)
    assert items[0][0] == str(new / "input.png")
    assert items[0][1].startswith("■ 2.4 s · seed 7 · ") and items[0][1].endswith("…")
    assert items[1][1] == "✓ 2.4 s · seed 7 · a cat"


def test_entry_video_details_and_reuse(tmp_path):
    done = jg.read_job(_job(tmp_path, "20250101-000000-aaaaaa", "done"))
    assert done.video.name == "final.mp4" and done.status == "done"
    details = done.details()
    assert details["settings"]["prompt"] == "a cat" and details["timings"] == {"total": 1.0}
    assert "versions" not in details
    values = st.values_from_settings(done.settings, 64)
    assert values["prompt"] == "a cat" and values["seed"] == 7 and values["steps"] == 3 and values["seconds"] == 2.4

    failed = jg.read_job(_job(tmp_path, "20250102-000000-bbbbbb", "failed", final=False))
    assert failed.video.name == "section_02.mp4"                              # newest section video
    assert failed.caption().startswith("✗")
    none = jg.read_job(_job(tmp_path, "20250103-000000-cccccc", "failed", final=False, sections=0))
    assert none.video is None


def test_entry_ignores_paths_in_job_json(tmp_path):
    d = tmp_path / "20250101-000000-eeeeee"
    d.mkdir()
    (tmp_path / "secret.mp4").write_bytes(b"x")
    (d / "job.json").write_text(json.dumps({"status": "done", "final": "../secret.mp4",
                                            "videos": ["/etc/passwd"], "settings": "not a dict"}))
    entry = jg.read_job(d)
    assert entry.video is None and entry.settings == {} and entry.thumbnail is None
    assert jg.gallery_items([entry]) == []
